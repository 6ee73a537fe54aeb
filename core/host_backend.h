// host_backend.h — the host cache's only door to the driver.
//
// The pinned host cache (host_cache.h) needs far less than the device
// allocator's DeviceBackend: page-locked allocations with their flags, and
// fences that say when every copy enqueued before them, on any stream that
// may touch host memory, has completed.  The shim implements it with
// cuMemHostAlloc/cuMemFreeHost and events (shim/cuda_host_backend.cpp); the unit
// tests with malloc and scripted fences (tests/unit/test_host_cache.cpp).
// No method may throw.
#pragma once

#include "types.h"

namespace cachalloc {

class HostBackend {
 public:
  virtual ~HostBackend() = default;

  // One page-locked allocation of exactly `size` bytes with the driver's
  // cuMemHostAlloc flags, and its release.
  virtual Status host_alloc(std::size_t size, unsigned flags, void** out) = 0;
  virtual Status host_free(void* ptr) = 0;

  // A fence completes once all work enqueued before it on every stream
  // that may read or write host memory has completed.  fence_record returns
  // kNotReady when none can be recorded now (a graph capture is in flight):
  // the blocks keep waiting.  Never a device synchronization.
  virtual Status fence_record(FenceId* out) = 0;
  virtual Status fence_query(FenceId fence) = 0;        // kSuccess once complete, kNotReady before
  virtual Status fence_synchronize(FenceId fence) = 0;  // waits for it
  virtual void fence_destroy(FenceId fence) = 0;
};

}  // namespace cachalloc
