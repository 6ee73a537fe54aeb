// free_policy.cpp — the free_sync rules.
#include "free_policy.h"

#include <shared_mutex>

#include "capture_tracking.h"
#include "stream_ids.h"

namespace cachalloc::shim {

FreeRule choose_free_rule(FreeSync policy, const ContextState& ctx) {
  switch (policy) {
    case FreeSync::stream:
      return FreeRule::stream;
    case FreeSync::device:
      return FreeRule::device;
    case FreeSync::fence:
      return ctx.other_threads_per_thread_streams() ? FreeRule::device : FreeRule::fence;
    case FreeSync::automatic:
      break;
  }
  if (!ctx.multi_stream()) [[likely]] return FreeRule::stream;
  return ctx.other_threads_per_thread_streams() ? FreeRule::device : FreeRule::fence;
}

Status free_by_rule(ContextState& ctx, DevicePtr ptr, FreeRule rule) {
  CachingAllocator& a = ctx.allocator();
  switch (rule) {
    case FreeRule::stream:
      return a.free(ptr);
    case FreeRule::fence: {
      std::vector<StreamId> streams = ctx.fence_streams();
      // A capturing stream executes nothing until its graph is launched: an
      // event recorded there would only join the capture.
      if (capture_in_flight()) [[unlikely]]
        std::erase_if(streams, [](StreamId id) {
          CUstream s = nullptr;
          return to_cu_stream(id, &s) && stream_is_capturing(s, false);
        });
      return a.free_fenced(ptr, streams);
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

}  // namespace cachalloc::shim
