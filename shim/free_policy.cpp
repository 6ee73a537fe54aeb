// free_policy.cpp — the free_sync rules.
#include "free_policy.h"

#include <cstdlib>

#include "capture_tracking.h"
#include "process_state.h"
#include "stream_ids.h"

namespace cachalloc::shim {

// compute-sanitizer (memcheck, racecheck, ...) sets these in the program it
// checks.  Under it, fences recorded on other threads' streams hang the
// process inside the tool's callbacks (docs/RELIABILITY.md: stress_patterns
// under memcheck hung in 3 of 4 runs with fences and in 0 of 8 bare); the
// driver's own rule, a device synchronization per cudaFree, does not.
bool detect_compute_sanitizer() {
  return std::getenv("NV_SANITIZER_INJECTION_PORT_BASE") != nullptr ||
         std::getenv("NV_SANITIZER_INJECTION_TRANSPORT_TYPE") != nullptr;
}

Status free_after_device_sync(ContextState& ctx, DevicePtr ptr) {
  CachingAllocator& a = ctx.allocator();
  // A device synchronization would break a capture: the block stays
  // allocated until it ends.  (A fenced free needs nothing: its fence is
  // refused while a capture is in flight, CudaBackend::fence_record.)
  if (capture_in_flight()) [[unlikely]] {
    if (!a.is_live(ptr)) return a.free(ptr);  // kNotOwned or kInvalidValue, nothing changes
    return ctx.defer_free(ptr) ? kSuccess : kInvalidValue;
  }
  // Only synchronize for pointers we own: a foreign pointer goes to the
  // real cuMemFree, which synchronizes by itself.
  if (!a.is_live(ptr)) return a.free(ptr);
  Status s = static_cast<Status>(real_driver()->cuCtxSynchronize());
  if (s != kSuccess) return s;
  return a.free(ptr);
}

void settle_deferred_frees_now(ContextState& ctx) {
  if (capture_in_flight()) return;
  for (DevicePtr ptr : ctx.take_deferred()) free_by_rule(ctx, ptr, choose_free_rule(ctx.free_sync(), ctx));
}

}  // namespace cachalloc::shim
