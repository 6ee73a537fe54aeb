// ipc_layout.cpp — judging the driver's IPC handle layout from its own small allocations.
#include "ipc_layout.h"

#include <cstring>

#include "format.h"
namespace cachalloc::shim {

std::uint64_t IpcHandleFields::size(const CUipcMemHandle& h) {
  std::uint64_t v = 0;
  std::memcpy(&v, h.reserved + kSizeOffset, sizeof v);
  return v;
}
std::uint32_t IpcHandleFields::offset(const CUipcMemHandle& h) {
  std::uint32_t v = 0;
  std::memcpy(&v, h.reserved + kOffsetOffset, sizeof v);
  return v;
}
void IpcHandleFields::set_size(CUipcMemHandle* h, std::uint64_t size) {
  std::memcpy(h->reserved + kSizeOffset, &size, sizeof size);
}
void IpcHandleFields::set_offset(CUipcMemHandle* h, std::uint32_t offset) {
  std::memcpy(h->reserved + kOffsetOffset, &offset, sizeof offset);
}

namespace {

using F = IpcHandleFields;

IpcLayoutVerdict refuted(std::string reason) { return {IpcLayout::kRefuted, std::move(reason)}; }

bool in_field(std::size_t byte) {
  return (byte >= F::kSizeOffset && byte < F::kSizeOffset + 8) ||
         (byte >= F::kOffsetOffset && byte < F::kOffsetOffset + 4);
}

// The two handles are byte for byte the same outside the size and offset.
bool same_but_fields(const CUipcMemHandle& a, const CUipcMemHandle& b) {
  for (std::size_t i = 0; i < sizeof a.reserved; ++i)
    if (!in_field(i) && a.reserved[i] != b.reserved[i]) return false;
  return true;
}

// Rules 1 and 2 for one sample: empty when it agrees with the driver.
std::string disagreement(const IpcProbeSample& s) {
  const auto ptr = static_cast<unsigned long long>(s.ptr);
  if (s.range_base != s.ptr)
    return obs::format("the driver reports base {:#x} for its own allocation at {:#x}",
                       static_cast<unsigned long long>(s.range_base), ptr);
  if (F::size(s.handle) != s.range_size)
    return obs::format("the size field (bytes {}-{}) reads {} for a {}-byte allocation", F::kSizeOffset,
                       F::kSizeOffset + 7, F::size(s.handle), s.range_size);
  if (s.mapping_known && F::offset(s.handle) != s.ptr - s.mapping_base)
    return obs::format("the offset field (bytes {}-{}) reads {:#x} for an allocation at offset {:#x} of its mapping",
                       F::kOffsetOffset, F::kOffsetOffset + 3, F::offset(s.handle),
                       static_cast<unsigned long long>(s.ptr - s.mapping_base));
  return {};
}

// Whether the driver says, or the handles show, that a and b share a mapping.
bool one_mapping(const IpcProbeSample& a, const IpcProbeSample& b) {
  if (a.mapping_known && b.mapping_known) return a.mapping_base == b.mapping_base;
  return same_but_fields(a.handle, b.handle);
}

}  // namespace

IpcLayoutVerdict judge_ipc_layout(std::span<const IpcProbeSample> samples) {
  bool known_nonzero = false;  // rule 2 held for a non-zero offset
  for (const IpcProbeSample& s : samples) {
    if (std::string why = disagreement(s); !why.empty()) return refuted(std::move(why));
    known_nonzero |= s.mapping_known && s.ptr != s.mapping_base;
  }
  bool pair = false;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    for (std::size_t j = i + 1; j < samples.size(); ++j) {
      const IpcProbeSample& a = samples[i];
      const IpcProbeSample& b = samples[j];
      if (a.ptr == b.ptr || !one_mapping(a, b)) continue;
      if (!same_but_fields(a.handle, b.handle))
        return refuted("the handles of two allocations in one mapping differ outside the size and offset fields");
      // Modular arithmetic: the difference of the fields is the difference of the pointers.
      const std::uint64_t field_delta = std::uint64_t{F::offset(b.handle)} - F::offset(a.handle);
      if (field_delta != b.ptr - a.ptr)
        return refuted(obs::format("the offset fields of two allocations of one mapping, {:#x} apart, read {:#x} "
                                   "and {:#x}",
                                   static_cast<unsigned long long>(b.ptr - a.ptr), F::offset(a.handle),
                                   F::offset(b.handle)));
      pair = true;
    }
  }
  if (!pair && !known_nonzero)
    return {IpcLayout::kInconclusive,
            "the driver gave its small probe allocations separate mappings of their own, so no handle shows where "
            "the offset field lies"};
  return {IpcLayout::kProven, {}};
}

}  // namespace cachalloc::shim
