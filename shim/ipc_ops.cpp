// ipc_ops.cpp — an IPC handle that describes the block, not its segment.
#include "ipc_ops.h"

#include <cstdint>
#include <limits>

#include "context_registry.h"
#include "ipc_layout.h"
#include "ipc_probe.h"
#include "log.h"
#include "process_state.h"
#include "start_up.h"

namespace cachalloc::shim {
namespace {

using F = IpcHandleFields;

// Rewrites the segment's handle to describe `info`'s block (the layout
// proven).  False when the handle does not carry the segment's size, or
// the block's offset does not fit the field.  The segment's own offset is
// 0 when the driver gave it a mapping of its own (every segment of 2 MiB
// and more, measured); were it sub-allocated, the block lies that much
// further into the mapping.
bool describe_block(CUipcMemHandle* h, const AddressInfo& info) {
  if (F::size(*h) != info.segment_size) return false;
  const std::uint64_t offset = std::uint64_t{F::offset(*h)} + (info.block - info.segment);
  if (offset > std::numeric_limits<std::uint32_t>::max()) return false;
  F::set_offset(h, static_cast<std::uint32_t>(offset));
  F::set_size(h, info.requested);
  return true;
}

CUresult refuse_expandable(CUdeviceptr ptr, bool tagged) {
  if (tagged) {
    obs::logger().error("cuIpcGetMemHandle({:#x}): the block belongs to a tag (cachalloc_set_tag), and tagged memory "
                        "is always cuMemMap'ed, which CUDA IPC cannot export (docs/PAUSE.md); allocate it untagged "
                        "to share it",
                        static_cast<unsigned long long>(ptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  obs::logger().error(
      "cuIpcGetMemHandle({:#x}): the block lies in an expandable segment (cuMemMap'ed memory), which CUDA IPC "
      "cannot export; run with CACHALLOC_CONF=expandable_segments:false to share this memory",
      static_cast<unsigned long long>(ptr));
  return CUDA_ERROR_INVALID_VALUE;  // what the driver answers for cuMemMap'ed memory
}

CUresult refuse_unproven(CUdeviceptr ptr) {
  obs::logger().error(
      "cuIpcGetMemHandle({:#x}): the block is part of a larger segment and this driver's IPC handle layout is not "
      "proven (see the earlier message), so no handle describing only the block can be made; refusing rather than "
      "exporting the wrong memory",
      static_cast<unsigned long long>(ptr));
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult refuse_segment_handle(CUdeviceptr ptr, const CUipcMemHandle& h, const AddressInfo& info) {
  obs::logger().error(
      "cuIpcGetMemHandle({:#x}): the driver's handle for the segment ({} bytes) carries size {} and offset {:#x}, "
      "not the proven layout; refusing rather than exporting the wrong memory",
      static_cast<unsigned long long>(ptr), info.segment_size, F::size(h), F::offset(h));
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

CUresult do_ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  const RealDriver* d = real_driver();
  AddressInfo info;
  ContextState* owner = serving(current_mode()) ? find_owner(static_cast<DevicePtr>(ptr), &info) : nullptr;
  if (owner == nullptr || handle == nullptr) return d->cuIpcGetMemHandle(handle, ptr);
  if (!info.live) return CUDA_ERROR_INVALID_VALUE;  // freed memory, as the driver answers
  if (info.expandable) return refuse_expandable(ptr, info.tag != kUntagged);
  // A block that is its whole segment is what a plain cuMemAlloc of its
  // size would be: the driver's own handle describes it exactly.
  const bool whole_segment = info.block == info.segment && info.requested == info.segment_size;
  if (!whole_segment) {
    const CUresult proof = ensure_ipc_layout_proven(d, owner->context());
    if (proof == CUDA_ERROR_NOT_SUPPORTED) return refuse_unproven(ptr);
    if (proof != CUDA_SUCCESS) return proof;
  }
  CUipcMemHandle h{};
  const CUresult r = d->cuIpcGetMemHandle(&h, static_cast<CUdeviceptr>(info.segment));
  if (r != CUDA_SUCCESS) return r;
  if (!whole_segment && !describe_block(&h, info)) return refuse_segment_handle(ptr, h, info);
  // The same allocation still live (not freed by another thread meanwhile).
  if (owner->allocator().mark_exported(info.block, info.id) != kSuccess) return CUDA_ERROR_INVALID_VALUE;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult do_get_handle_for_address_range(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                         unsigned long long flags) {
  ContextState* owner = serving(current_mode()) ? find_owner(static_cast<DevicePtr>(dptr)) : nullptr;
  const CUresult r = real_driver()->cuMemGetHandleForAddressRange(handle, dptr, size, type, flags);
  // Programs round the range out to pages: every block it touches is kept.
  if (r == CUDA_SUCCESS && owner != nullptr) owner->allocator().mark_range_exported(dptr, dptr + size);
  return r;
}

}  // namespace cachalloc::shim
