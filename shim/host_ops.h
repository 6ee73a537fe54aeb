// host_ops.h — the pinned host memory hooks (cuMemHostAlloc and family).
//
// One process-wide HostCache (core/host_cache.h) over CudaHostBackend
// serves cuMemHostAlloc, cuMemAllocHost and (runtime_entry_points.cpp)
// cudaHostAlloc / cudaMallocHost, when the process is served, the key
// pinned_max_cached_mb is not 0, a context is current, the size is not 0
// and the flags are the driver's three; anything else goes to the driver
// unchanged.  Every block is owned by the context current at allocation
// (its ContextState); blocks without the portable flag serve only that
// context, and all of a context's blocks leave the cache when it is
// destroyed (host_cache.h).
//
// Fidelity: a cached block is the driver's own allocation of the class
// size, so cuMemHostGetDevicePointer goes to the driver for a live block
// (its device alias is the block's), and so does cuMemHostGetFlags, whose
// answer is then made the driver's for a fresh allocation of the flags
// asked (asked | the driver's DEVICEMAP bit: the driver reports the flags
// of the chunk a small allocation was carved from, and cached blocks keep
// chunks alive; host_ops.cpp); for memory the program freed (cached), or
// past the requested size, they answer as for memory the driver does not
// know (CUDA_ERROR_INVALID_VALUE).  The address range and pointer attributes
// (address_ops.cpp) describe an allocation of exactly the requested size.
// cuMemFreeHost of a pointer in no block goes to the driver; a double free
// or an interior pointer gets CUDA_ERROR_INVALID_VALUE, as from the driver.
// cuMemHostRegister is never hooked: a registered range is the program's
// memory and is never in a block.
#pragma once

#include <cstddef>

#include "cuda_api.h"
#include "host_cache.h"

namespace cachalloc::shim {

CUresult do_mem_host_alloc(void** pp, std::size_t size, unsigned flags);
CUresult do_mem_alloc_host(void** pp, std::size_t size);
CUresult do_mem_free_host(void* p);
CUresult do_mem_host_get_flags(unsigned* flags, void* p);
CUresult do_mem_host_get_device_pointer(CUdeviceptr* out, void* p, unsigned flags);

// The runtime hooks: kSuccess when the cache served or freed; otherwise
// the caller goes to cudart (which reaches the hooked driver calls above).
Status host_cache_alloc(void** pp, std::size_t size, unsigned flags);
Status host_cache_free(void* p);

// What the cache knows about `p` (any address in a block, live or cached);
// false when no block holds it or the cache was never used.
bool host_block_of(const void* p, HostBlockInfo* info);
// A process-unique CU_POINTER_ATTRIBUTE_BUFFER_ID for allocation `serial`
// (bit 62 as ContextState::buffer_id, the context index field all ones).
inline unsigned long long host_buffer_id(std::uint64_t serial) {
  return (1ULL << 62) | (((1ULL << 18) - 1) << 44) | (serial & ((1ULL << 44) - 1));
}

class ContextState;
// `ctx` was destroyed: the driver freed the pinned memory allocated in it,
// so its blocks leave the cache (HostCache::forget_owner).  The context
// registry's retired listener, set when the cache is created: called by
// forget_context without the registry's lock held (a fence takes the
// cache's lock, then that one).
void host_context_retired(ContextState* ctx);

// The cache, or nullptr when it was never created (for reports and the
// control API).
HostCache* host_cache_if_any();

}  // namespace cachalloc::shim
