// free_policy.cpp — the free_sync rules.
#include "free_policy.h"

#include "capture_tracking.h"
#include "process_state.h"
#include "stream_ids.h"

namespace cachalloc::shim {

FreeRule choose_free_rule(FreeSync policy, const ContextState& ctx) {
  switch (policy) {
    case FreeSync::stream:
      return FreeRule::stream;
    case FreeSync::device:
      return FreeRule::device;
    case FreeSync::fence:
      return ctx.nonblocking_streams_live() ? FreeRule::device : FreeRule::fence;
    case FreeSync::automatic:
      break;
  }
  if (!ctx.multi_stream()) [[likely]] return FreeRule::stream;
  return ctx.nonblocking_streams_live() ? FreeRule::device : FreeRule::fence;
}

Status free_by_rule(ContextState& ctx, DevicePtr ptr, FreeRule rule) {
  CachingAllocator& a = ctx.allocator();
  if (rule != FreeRule::stream && capture_in_flight()) [[unlikely]] {
    if (!a.is_live(ptr)) return a.free(ptr);  // kNotOwned or kInvalidValue, nothing changes
    return ctx.defer_free(ptr) ? kSuccess : kInvalidValue;
  }
  switch (rule) {
    case FreeRule::stream:
      return a.free(ptr);
    case FreeRule::fence: {
      // An event on the legacy stream completes only after all work enqueued
      // before it on every blocking stream, per-thread default streams
      // included: one event covers them all.
      static constexpr StreamId kLegacyOnly[] = {kLegacyStreamId};
      return a.free_fenced(ptr, kLegacyOnly);
    }
    case FreeRule::device: {
      // Only synchronize for pointers we own: a foreign pointer goes to the
      // real cuMemFree, which synchronizes by itself.
      if (!a.is_live(ptr)) return a.free(ptr);
      Status s = static_cast<Status>(real_driver()->cuCtxSynchronize());
      if (s != kSuccess) return s;
      return a.free(ptr);
    }
  }
  return kInvalidValue;
}

void settle_deferred_frees(ContextState& ctx) {
  if (!ctx.has_deferred() || capture_in_flight()) [[likely]] return;
  for (DevicePtr ptr : ctx.take_deferred()) free_by_rule(ctx, ptr, choose_free_rule(config().free_sync, ctx));
}

}  // namespace cachalloc::shim
