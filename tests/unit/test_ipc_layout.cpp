// test_ipc_layout.cpp — judge_ipc_layout (shim/ipc_layout.h) on handles the
// real driver made (H100, driver 580, read off the GPU) and on the layouts
// it must not accept: fields moved, an extra per-allocation field, offsets
// that are not offsets, and a driver that never shares a mapping.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "../../shim/ipc_layout.h"

using cachalloc::shim::IpcHandleFields;
using cachalloc::shim::IpcLayout;
using cachalloc::shim::IpcProbeSample;
using cachalloc::shim::judge_ipc_layout;

namespace {

using F = IpcHandleFields;

constexpr CUdeviceptr kMapping = 0x7f1b4de00000;

// The handle of the 512 B cuMemAlloc at offset 0 of a shared mapping, as
// the driver returned it; the others of that mapping differ only in size
// (bytes 16-23) and offset (bytes 28-31).
CUipcMemHandle measured_handle(std::uint64_t size, std::uint32_t offset) {
  static const unsigned char bytes[64] = {
      0x70, 0x56, 0x66, 0x00, 0x58, 0x55, 0x00, 0x00, 0x29, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x06, 0x00, 0x00, 0x00, 0x00, 0xff, 0x00, 0x00, 0x32, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x1d, 0x00, 0xd0, 0xc1, 0x96, 0x00, 0x00, 0x5c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  CUipcMemHandle h;
  std::memcpy(h.reserved, bytes, sizeof bytes);
  F::set_size(&h, size);
  F::set_offset(&h, offset);
  return h;
}

IpcProbeSample sample(std::uint32_t offset, std::size_t size, bool mapping_known = true) {
  IpcProbeSample s;
  s.ptr = s.range_base = kMapping + offset;
  s.range_size = size;
  s.mapping_known = mapping_known;
  s.mapping_base = mapping_known ? kMapping : 0;
  s.handle = measured_handle(size, offset);
  return s;
}

// The probe's three allocations as the H100 placed them (200, 700 and 1300
// bytes at offsets 0, 0x200 and 0x600 of one mapping).
std::vector<IpcProbeSample> measured(bool mapping_known = true) {
  return {sample(0, 200, mapping_known), sample(0x200, 700, mapping_known), sample(0x600, 1300, mapping_known)};
}

// Moves the offset field to bytes 48-51 (bytes 28-31 zero).
void move_offset(IpcProbeSample* s) {
  const std::uint32_t offset = F::offset(s->handle);
  F::set_offset(&s->handle, 0);
  std::memcpy(s->handle.reserved + 48, &offset, sizeof offset);
}

}  // namespace

TEST_CASE("ipc layout: the H100's handles prove it, with or without the mapping attribute") {
  CHECK(judge_ipc_layout(measured()).layout == IpcLayout::kProven);
  CHECK(judge_ipc_layout(measured(false)).layout == IpcLayout::kProven);
  // The probe's first allocation may close a mapping: a later pair suffices.
  std::vector<IpcProbeSample> s = measured();
  s[0] = sample(0, 200);
  s[0].ptr = s[0].range_base = s[0].mapping_base = 0x7f0000000000;
  s[0].handle.reserved[40] = 0x31;  // another mapping's id
  CHECK(judge_ipc_layout(s).layout == IpcLayout::kProven);
  CHECK(judge_ipc_layout(measured()).reason.empty());
}

// The probe's allocations as the H100 placed them after thousands of small
// allocations and frees: each in a hole at the end of a different mapping.
static std::vector<IpcProbeSample> fragmented(bool mapping_known) {
  static const std::uint32_t at[3] = {0x1ffe00, 0x1ffc00, 0x1ffa00};
  static const std::size_t sizes[3] = {200, 700, 1300};
  std::vector<IpcProbeSample> s;
  for (int i = 0; i < 3; ++i) {
    IpcProbeSample x = sample(at[i], sizes[i], mapping_known);
    const CUdeviceptr base = kMapping + (static_cast<std::uint64_t>(i) << 24);
    x.ptr = x.range_base = base + at[i];
    x.mapping_base = mapping_known ? base : 0;
    x.handle.reserved[40] = static_cast<char>(0x40 + i);  // each mapping's own id
    s.push_back(x);
  }
  return s;
}

TEST_CASE("ipc layout: allocations in separate mappings prove it through the mapping attribute alone") {
  CHECK(judge_ipc_layout(fragmented(true)).layout == IpcLayout::kProven);
  // Without the attribute nothing shows where the offset lies.
  CHECK(judge_ipc_layout(fragmented(false)).layout == IpcLayout::kInconclusive);
  // A moved offset field still fails against the attribute.
  std::vector<IpcProbeSample> s = fragmented(true);
  move_offset(&s[0]);
  CHECK(judge_ipc_layout(s).layout == IpcLayout::kRefuted);
}

TEST_CASE("ipc layout: a moved offset field is not accepted") {
  std::vector<IpcProbeSample> s = measured();
  for (IpcProbeSample& x : s) move_offset(&x);
  auto v = judge_ipc_layout(s);
  CHECK(v.layout == IpcLayout::kRefuted);
  CHECK(v.reason.find("offset field") != std::string::npos);
  // Without the attribute the handles differ at byte 48: nothing shares a mapping.
  s = measured(false);
  for (IpcProbeSample& x : s) move_offset(&x);
  CHECK(judge_ipc_layout(s).layout == IpcLayout::kInconclusive);
}

TEST_CASE("ipc layout: a moved size field is not accepted") {
  std::vector<IpcProbeSample> s = measured();
  for (IpcProbeSample& x : s) {  // the size at 48, its 512 B rounding at 16
    const std::uint64_t size = F::size(x.handle);
    std::memcpy(x.handle.reserved + 48, &size, sizeof size);
    F::set_size(&x.handle, (size + 511) / 512 * 512);
  }
  auto v = judge_ipc_layout(s);
  CHECK(v.layout == IpcLayout::kRefuted);
  CHECK(v.reason.find("size field") != std::string::npos);
}

TEST_CASE("ipc layout: an offset field that is not the offset from the mapping is not accepted") {
  // The low 32 bits of the address: differences match, values do not.
  std::vector<IpcProbeSample> s = measured();
  for (IpcProbeSample& x : s) F::set_offset(&x.handle, static_cast<std::uint32_t>(x.ptr));
  CHECK(judge_ipc_layout(s).layout == IpcLayout::kRefuted);
  // Offsets of one mapping whose difference is not the pointers'.
  s = measured(false);
  F::set_offset(&s[2].handle, 0x800);
  CHECK(judge_ipc_layout(s).layout == IpcLayout::kRefuted);
}

TEST_CASE("ipc layout: a per-allocation field outside the two is not accepted") {
  std::vector<IpcProbeSample> s = measured();
  for (std::size_t i = 0; i < s.size(); ++i) s[i].handle.reserved[60] = static_cast<char>(i + 1);
  auto v = judge_ipc_layout(s);
  CHECK(v.layout == IpcLayout::kRefuted);
  CHECK(v.reason.find("differ outside") != std::string::npos);
}

TEST_CASE("ipc layout: a driver that never shares a mapping proves nothing") {
  std::vector<IpcProbeSample> s = measured();
  for (std::size_t i = 0; i < s.size(); ++i) {
    IpcProbeSample& x = s[i];
    x.ptr = x.range_base = x.mapping_base = kMapping + i * (2u << 20);
    F::set_offset(&x.handle, 0);
    x.handle.reserved[40] = static_cast<char>(0x40 + i);
  }
  auto v = judge_ipc_layout(s);
  CHECK(v.layout == IpcLayout::kInconclusive);
  CHECK(v.reason.find("separate mappings") != std::string::npos);
  CHECK(judge_ipc_layout({}).layout == IpcLayout::kInconclusive);
}

TEST_CASE("ipc layout: the driver's own range must be the allocation") {
  std::vector<IpcProbeSample> s = measured();
  s[1].range_base = kMapping;
  CHECK(judge_ipc_layout(s).layout == IpcLayout::kRefuted);
}
