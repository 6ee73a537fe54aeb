// cuda_host_backend.h — the host cache's HostBackend on the real driver.
//
// Pinned blocks are cuMemHostAlloc/cuMemFreeHost of the REAL driver.  Host
// memory belongs to no single context: a copy from a pinned block may run
// on a stream of any context.  So a host fence covers every live context
// the shim knows (a state of context_registry.h): with that context made
// current, one event on its legacy stream — which orders after all its
// blocking streams, per-thread ones included — and one on each of its busy
// non-blocking streams, as CudaBackend::fence_record does for a context's
// own memory.  Contexts the shim never saw are not covered: a context
// becomes known at its first allocation, device or pinned (docs/HOST.md).
// A fence is refused (kNotReady) while a graph capture is in flight, and
// never synchronizes anything.  The host cache calls the fence methods
// under its own lock, which guards the spare events here.
#pragma once

#include <map>
#include <vector>

#include "host_backend.h"
#include "real_driver.h"

namespace cachalloc::shim {

class ContextState;

class CudaHostBackend final : public HostBackend {
 public:
  explicit CudaHostBackend(const RealDriver* driver) : d_(driver) {}

  Status host_alloc(std::size_t size, unsigned flags, void** out) override;
  Status host_free(void* ptr) override;
  Status fence_record(FenceId* out) override;
  Status fence_query(FenceId fence) override;
  Status fence_synchronize(FenceId fence) override;
  void fence_destroy(FenceId fence) override;

 private:
  struct Mark {
    ContextState* ctx;
    CUevent event;
  };
  struct Fence {
    std::vector<Mark> marks;
    std::size_t done = 0;  // marks known complete, in order
  };
  bool record(Fence* f, ContextState* ctx, CUstream stream);
  bool cover_context(Fence* f, ContextState* ctx);
  Status wait_marks(Fence* f, bool block);

  const RealDriver* d_;
  std::map<ContextState*, std::vector<CUevent>> spare_events_;  // per context
  std::vector<Fence*> spare_fences_;  // never freed: the process may exit with the driver gone
};

}  // namespace cachalloc::shim
