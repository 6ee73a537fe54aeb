// ipc_ops.cpp — an IPC handle that describes the block, not its segment.
#include "ipc_ops.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "context_registry.h"
#include "log.h"
#include "process_state.h"

namespace cachalloc::shim {
namespace {

std::uint64_t read_u64(const CUipcMemHandle& h, std::size_t at) {
  std::uint64_t v = 0;
  std::memcpy(&v, h.reserved + at, sizeof v);
  return v;
}
std::uint32_t read_u32(const CUipcMemHandle& h, std::size_t at) {
  std::uint32_t v = 0;
  std::memcpy(&v, h.reserved + at, sizeof v);
  return v;
}

// Rewrites the segment's handle to describe `info`'s block; false when the
// handle does not have the layout cachalloc knows (see the header).
bool describe_block(CUipcMemHandle* h, const AddressInfo& info) {
  using F = IpcHandleFields;
  if (read_u64(*h, F::kSizeOffset) != info.segment_size || read_u32(*h, F::kOffsetOffset) != 0) return false;
  const std::uint64_t offset = info.block - info.segment;
  if (offset > std::numeric_limits<std::uint32_t>::max()) return false;
  const auto offset32 = static_cast<std::uint32_t>(offset);
  const std::uint64_t size = info.requested;
  std::memcpy(h->reserved + F::kOffsetOffset, &offset32, sizeof offset32);
  std::memcpy(h->reserved + F::kSizeOffset, &size, sizeof size);
  return true;
}

CUresult refuse_expandable(CUdeviceptr ptr) {
  obs::logger().error(
      "cuIpcGetMemHandle({:#x}): the block lies in an expandable segment (cuMemMap'ed memory), which CUDA IPC "
      "cannot export; run with CACHALLOC_CONF=expandable_segments:false to share this memory",
      static_cast<unsigned long long>(ptr));
  return CUDA_ERROR_INVALID_VALUE;  // what the driver answers for cuMemMap'ed memory
}

CUresult refuse_unknown_layout(CUdeviceptr ptr) {
  obs::logger().error(
      "cuIpcGetMemHandle({:#x}): this driver's IPC handle has a layout cachalloc does not know, so a handle for a "
      "block inside a segment cannot be made; refusing rather than exporting the wrong memory",
      static_cast<unsigned long long>(ptr));
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

CUresult do_ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  const RealDriver* d = real_driver();
  AddressInfo info;
  ContextState* owner = serving(current_mode()) ? find_owner(static_cast<DevicePtr>(ptr), &info) : nullptr;
  if (owner == nullptr || handle == nullptr) return d->cuIpcGetMemHandle(handle, ptr);
  if (!info.live) return CUDA_ERROR_INVALID_VALUE;  // freed memory, as the driver answers
  if (info.expandable) return refuse_expandable(ptr);
  CUipcMemHandle h{};
  const CUresult r = d->cuIpcGetMemHandle(&h, static_cast<CUdeviceptr>(info.segment));
  if (r != CUDA_SUCCESS) return r;
  // A block at the segment's start is described by the segment's handle as
  // it is (the importer maps more, beginning with the block) when the
  // layout is unknown; anything else needs the rewrite.
  if (!describe_block(&h, info) && info.block != info.segment) return refuse_unknown_layout(ptr);
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
