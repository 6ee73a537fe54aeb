// graph_pools.h — PyTorch's CUDA graph pools, through the pluggable
// allocator (pluggable_api.cpp).
//
// A graph captured with torch.cuda.graph replays the addresses its capture
// allocated, whenever it runs, until PyTorch destroys it.  PyTorch tells an
// allocator about this through three hooks its pluggable wrapper exposes as
// setters taking a function pointer of a C++ type (PyTorch 2.3 and later):
//   begin_allocate_to_pool(device, pool id, filter)  a capture (or a
//       MemPool context) begins; `filter(stream)` says which streams'
//       allocations belong to the pool
//   end_allocate_to_pool(device, pool id)            it ended
//   release_pool(device, pool id)                     the graph is gone
// cachalloc exports them (cachalloc_pluggable_*_pool below;
// cachalloc.use_with_torch() wires them).  An allocation on a capturing
// stream that an open pool takes is served from that pool: a block of it
// freed earlier on the same stream (graph order) or outside any capture
// (PyTorch's rule for pools shared between graphs), else a new one from
// cuMemAlloc with the thread's capture mode relaxed for the call, as
// PyTorch's own allocator does (a global-mode capture refuses it
// otherwise).  Its blocks are never handed to anything but the pool; once
// the pool is released and no pool is open (so no capture is in flight),
// they go back to the driver as their last owner frees them.
//
// Without the hooks wired (an older PyTorch, another framework), an
// allocation during a capture is kept for good (pluggable_api.cpp).
#pragma once

#include <cstddef>

#include "cuda_api.h"
#include "real_driver.h"

namespace cachalloc::shim {

// An allocation of `size` on `stream`, which is being captured: served
// from the open pool of `device` that takes the stream (*out; nullptr when
// the driver is out of memory).  False when no open pool takes it.
bool graph_pool_malloc(const RealDriver* d, int device, CUstream stream, std::size_t size, void** out);

// `ptr` is a pool's block: it is free for the pool's later allocations
// (freed on `stream`), or, its pool released, waits to go back to the
// driver.  False when it is no pool's.
bool graph_pool_free(void* ptr, CUstream stream);

// The blocks of released pools that nothing uses go back to the driver,
// if no pool is open (no capture in flight).  Called by the pluggable ABI
// outside captures; cheap when there is nothing to give back.
void give_back_released_pool_blocks(const RealDriver* d);

// cuMemAlloc_v2 during a capture, the calling thread's capture mode
// relaxed for the call (cuThreadExchangeStreamCaptureMode).
CUresult alloc_during_capture(const RealDriver* d, CUdeviceptr* p, std::size_t size);

// Bytes the pools hold now, and how many pools are open (for tests and
// the dump).
std::size_t graph_pool_bytes();
int open_graph_pools();

}  // namespace cachalloc::shim
