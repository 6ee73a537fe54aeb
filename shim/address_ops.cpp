// address_ops.cpp — address ranges and pointer attributes of cachalloc blocks.
#include "address_ops.h"

#include <atomic>

#include "context_registry.h"
#include "host_ops.h"
#include "link_imports.h"
#include "log.h"
#include "process_state.h"
#include "start_up.h"

namespace cachalloc::shim {
namespace {

const RealDriver* driver() { return real_driver(); }

// The owner of `ptr` when cachalloc must answer for it; nullptr sends the
// call to the driver (not serving, or not cachalloc memory).
ContextState* owner_of(CUdeviceptr ptr, AddressInfo* info) {
  if (!serving(current_mode())) return nullptr;
  return find_owner(static_cast<DevicePtr>(ptr), info);
}

// Overwrites the attributes that name an allocation — its range and its
// buffer id — with those of an allocation of `size` bytes at `start`.
// True when `attribute` was one of them.
bool describe_range(CUpointer_attribute attribute, void* data, CUdeviceptr start, size_t size,
                    unsigned long long buffer_id) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = start;
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = size;
      return true;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = buffer_id;
      return true;
    default:
      return false;
  }
}

// Overwrites the attributes that describe the allocation itself with the
// block's; the driver has answered the rest for the segment.
void describe_block(CUpointer_attribute attribute, void* data, const ContextState& owner, const AddressInfo& info) {
  if (data == nullptr) return;
  if (describe_range(attribute, data, static_cast<CUdeviceptr>(info.block), info.requested, owner.buffer_id(info.id)))
    return;
  if (attribute == CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES)
    *static_cast<unsigned long long*>(data) = 0;  // expandable pages allow fds; a block must not
}

// Pinned host blocks (host_ops.h): `p` in a block of the host cache.
// live: the program's allocation holds `p` (inside its requested bytes).
struct HostAnswer {
  bool ours = false;
  bool live = false;
  HostBlockInfo info;
};

HostAnswer host_answer(CUdeviceptr p) {
  HostAnswer a;
  if (!serving(current_mode())) return a;
  a.ours = host_block_of(reinterpret_cast<const void*>(p), &a.info);
  a.live = a.ours && a.info.live && p - reinterpret_cast<CUdeviceptr>(a.info.base) < a.info.requested;
  return a;
}

void describe_host_block(CUpointer_attribute attribute, void* data, const HostBlockInfo& info) {
  if (data != nullptr)
    describe_range(attribute, data, reinterpret_cast<CUdeviceptr>(info.base), info.requested,
                   host_buffer_id(info.serial));
}

// An address the driver certainly does not know (host memory no program
// registers): asking about it yields the driver's defaults for freed memory.
char g_unknown_to_the_driver;

}  // namespace

CUresult do_mem_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  if (const HostAnswer h = host_answer(ptr); h.ours) {
    if (!h.live) return CUDA_ERROR_NOT_FOUND;
    if (base != nullptr) *base = reinterpret_cast<CUdeviceptr>(h.info.base);
    if (size != nullptr) *size = h.info.requested;
    return CUDA_SUCCESS;
  }
  AddressInfo info;
  if (owner_of(ptr, &info) == nullptr) return driver()->cuMemGetAddressRange_v2(base, size, ptr);
  if (!info.live) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = static_cast<CUdeviceptr>(info.block);
  if (size != nullptr) *size = info.requested;
  return CUDA_SUCCESS;
}

CUresult do_pointer_get_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (const HostAnswer h = host_answer(ptr); h.ours) {
    if (!h.live) return CUDA_ERROR_INVALID_VALUE;
    const CUresult r = driver()->cuPointerGetAttribute(data, attribute, ptr);
    if (r == CUDA_SUCCESS) describe_host_block(attribute, data, h.info);
    return r;
  }
  AddressInfo info;
  ContextState* owner = owner_of(ptr, &info);
  if (owner == nullptr) return driver()->cuPointerGetAttribute(data, attribute, ptr);
  if (!info.live) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = driver()->cuPointerGetAttribute(data, attribute, ptr);
  if (r == CUDA_SUCCESS) describe_block(attribute, data, *owner, info);
  return r;
}

CUresult do_pointer_get_attributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                   CUdeviceptr ptr) {
  AddressInfo info;
  const HostAnswer h = host_answer(ptr);
  ContextState* owner = h.ours ? nullptr : owner_of(ptr, &info);
  if (h.live) {
    const CUresult r = driver()->cuPointerGetAttributes(count, attributes, data, ptr);
    if (r == CUDA_SUCCESS)
      for (unsigned i = 0; i < count; ++i) describe_host_block(attributes[i], data[i], h.info);
    return r;
  }
  if (owner == nullptr && !h.ours) return driver()->cuPointerGetAttributes(count, attributes, data, ptr);
  if (h.ours || !info.live) {
    // The driver's defaults for an unknown address, as it writes them (value
    // widths included); only HOST_POINTER echoes the queried address back.
    const auto unknown = reinterpret_cast<CUdeviceptr>(&g_unknown_to_the_driver);
    const CUresult r = driver()->cuPointerGetAttributes(count, attributes, data, unknown);
    for (unsigned i = 0; attributes != nullptr && data != nullptr && i < count; ++i)
      if (attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER && data[i] != nullptr &&
          *static_cast<CUdeviceptr*>(data[i]) == unknown)
        *static_cast<CUdeviceptr*>(data[i]) = ptr;
    return r;
  }
  const CUresult r = driver()->cuPointerGetAttributes(count, attributes, data, ptr);
  if (r == CUDA_SUCCESS)
    for (unsigned i = 0; i < count; ++i) describe_block(attributes[i], data[i], *owner, info);
  return r;
}

// SYNC_MEMOPS applies to the segment: synchronous copies of its other
// blocks become synchronous too, which changes no result.
CUresult do_pointer_set_attribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  AddressInfo info;
  if (owner_of(ptr, &info) != nullptr && !info.live) return CUDA_ERROR_INVALID_VALUE;
  if (const HostAnswer h = host_answer(ptr); h.ours && !h.live) return CUDA_ERROR_INVALID_VALUE;
  return driver()->cuPointerSetAttribute(value, attribute, ptr);
}

bool inside_cachalloc_memory(CUdeviceptr ptr) {
  return serving(current_mode()) && find_owner(static_cast<DevicePtr>(ptr)) != nullptr;
}

void warn_green_context() {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  obs::logger().error(
      "cuGreenCtxCreate: cachalloc does not support green contexts: a free does not wait for work on green-context "
      "streams, and their allocations are cached apart from the primary context's; run this program without "
      "cachalloc");
}

void note_green_stream(CUstream stream) {
  if (!serving(current_mode())) return;
  note_streams_outside_contexts();
  const StreamId id = stream_id(stream, false);
  for (ContextState* s : live_context_states()) {
    ContextGuard guard(driver(), s->context());
    s->note_foreign_stream(id);
  }
}

CUresult do_mem_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr) {
  AddressInfo info;
  if (owner_of(reinterpret_cast<CUdeviceptr>(addr), &info) != nullptr) return CUDA_ERROR_INVALID_VALUE;
  return driver()->cuMemRetainAllocationHandle(handle, addr);
}

}  // namespace cachalloc::shim
