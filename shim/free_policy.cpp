// free_policy.cpp — the free_sync rules.
#include "free_policy.h"

#include "capture_tracking.h"
#include "process_state.h"
#include "stream_ids.h"

namespace cachalloc::shim {

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

void settle_deferred_frees(ContextState& ctx) {
  if (!ctx.has_deferred() || capture_in_flight()) [[likely]] return;
  for (DevicePtr ptr : ctx.take_deferred()) free_by_rule(ctx, ptr, choose_free_rule(config().free_sync, ctx));
}

}  // namespace cachalloc::shim
