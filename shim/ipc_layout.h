// ipc_layout.h — what proves the layout of the driver's IPC handle.
//
// cachalloc describes a block inside a segment by rewriting two fields of
// the segment's CUipcMemHandle (ipc_ops.h).  The driver documents no
// layout, and a segment's own handle (its size, offset 0) cannot show where
// the offset field is: a zero anywhere would pass.  So the layout is proven
// from allocations the driver itself sub-allocates.  Measured on an H100
// (driver 580): cuMemAllocs up to 1 MiB share 2 MiB mappings, and each
// exports as its mapping's handle with its own size at bytes 16–23 and its
// offset in the mapping at bytes 28–31 (512 B, 1 KiB, 1.5 KiB and 100 B at
// offsets 0, 0x200, 0x600, 0xc00 of one mapping); the handles of one
// mapping differ in those two fields only, and
// CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR reports the mapping's base.
//
// judge_ipc_layout() decides from such samples (ipc_probe.h takes them):
//  1. each handle's size field is the size the driver reports for that
//     allocation (cuMemGetAddressRange; the probe's sizes differ and are no
//     multiples of 512, so a rounded size or another field fails);
//  2. where the driver reports the mapping's base, each handle's offset
//     field is the allocation's offset from it;
//  3. two handles that name one mapping (the same reported base, or
//     identical outside the two fields) are identical outside the two
//     fields, and their offset fields differ by exactly the pointers'
//     difference: nothing else tells two allocations of one mapping apart,
//     so a rewritten handle is the one the driver would make for an
//     allocation at that place.
// Proven when all three hold and a known non-zero offset was seen where
// cachalloc writes it: rule 2 for an allocation not at its mapping's
// start, or a pair under rule 3 (its difference is not zero).  Refuted
// when a rule fails.  Inconclusive otherwise: every probe allocation at
// the start of a mapping of its own (a driver that does not sub-allocate),
// or, without the attribute, in mappings of their own — then nothing
// shows where the offset lies.  Measured on the H100: in a fresh process
// the three probe allocations share one mapping (offsets 0, 0x200, 0x600);
// after thousands of small allocations and frees the driver put each in a
// hole at the end of a different mapping (offsets 0x1ffe00, 0x1ffc00,
// 0x1ffa00), which rule 2 alone proves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "cuda_api.h"

namespace cachalloc::shim {

// The fields of the driver's handle that cachalloc rewrites.
struct IpcHandleFields {
  static constexpr std::size_t kSizeOffset = 16;    // uint64: bytes the handle describes
  static constexpr std::size_t kOffsetOffset = 28;  // uint32: offset inside the physical allocation
  static std::uint64_t size(const CUipcMemHandle& h);
  static std::uint32_t offset(const CUipcMemHandle& h);
  static void set_size(CUipcMemHandle* h, std::uint64_t size);
  static void set_offset(CUipcMemHandle* h, std::uint32_t offset);
};

// One of the driver's own small allocations, as the driver describes it.
struct IpcProbeSample {
  CUdeviceptr ptr = 0;
  CUdeviceptr range_base = 0;  // cuMemGetAddressRange
  std::size_t range_size = 0;
  bool mapping_known = false;  // the driver answered MAPPING_BASE_ADDR
  CUdeviceptr mapping_base = 0;
  CUipcMemHandle handle{};     // cuIpcGetMemHandle(ptr)
};

enum class IpcLayout { kProven, kRefuted, kInconclusive };

struct IpcLayoutVerdict {
  IpcLayout layout = IpcLayout::kInconclusive;
  std::string reason;  // what failed (empty when proven)
};

IpcLayoutVerdict judge_ipc_layout(std::span<const IpcProbeSample> samples);

}  // namespace cachalloc::shim
