// free_policy.h — how a plain cuMemFree_v2 / cudaFree makes a block reusable.
//
// cuMemFree implicitly synchronizes, so programs free memory that kernels on
// other streams may still be using.  CACHALLOC_CONF free_sync picks the rule:
//   stream — allocator.free(): reuse at once for the next cuMemAlloc, safe
//            when all work runs in one stream order (PyTorch's rule).
//   device — cuCtxSynchronize, then free: cudaFree's own cost.
//   fence  — allocator.free_deferred(): no driver call at the free; the
//            block is reused once a fence recorded after it completes — one
//            event on the legacy stream (ordering every blocking stream,
//            per-thread default streams included) and one on each live
//            non-blocking stream, recorded for a batch of frees when the
//            cache misses (core/ledger_fences.cpp, CudaBackend::fence_record).
//   auto   — stream while the driver orders all the context's work in one
//            sequence (the legacy stream and at most one blocking stream:
//            ContextState::multi_stream), else fence (device under
//            compute-sanitizer, where fences recorded across threads hang
//            inside the tool).  The switch synchronizes the device once, for
//            the blocks reused at once before it (leave_serial).
//
// The stream-destroy hook and a fence's records take one lock
// (stream_set.h): a fence never records on a stream being destroyed.
#pragma once

#include "context_registry.h"

namespace cachalloc::shim {

enum class FreeRule { stream, fence, device };

// Whether compute-sanitizer runs the program (auto then means device:
// fences recorded across threads hang inside the tool).  Read once.
bool detect_compute_sanitizer();
inline bool under_compute_sanitizer() {
  static const bool yes = detect_compute_sanitizer();
  return yes;
}

// The rule `policy` means for `ctx` right now.  (The rules and the stream
// and fence frees are inline: they are on every cuMemFree.)
[[gnu::always_inline]] inline FreeRule choose_free_rule(FreeSync policy, const ContextState& ctx) {
  // The default first: one compare on every cuMemFree instead of a switch's three.
  if (policy == FreeSync::automatic) [[likely]] {
    if (!ctx.multi_stream()) [[likely]] return FreeRule::stream;
    return under_compute_sanitizer() ? FreeRule::device : FreeRule::fence;
  }
  switch (policy) {
    case FreeSync::stream:
      return FreeRule::stream;
    case FreeSync::device:
      return FreeRule::device;
    case FreeSync::fence:
      return FreeRule::fence;
    case FreeSync::automatic:
      break;
  }
  if (!ctx.multi_stream()) return FreeRule::stream;
  return under_compute_sanitizer() ? FreeRule::device : FreeRule::fence;
}

// free_by_rule's device rule.
Status free_after_device_sync(ContextState& ctx, DevicePtr ptr);

// Frees `ptr` in `ctx` (current) by `rule`.  Returns the core's Status
// (kNotOwned when the allocator does not own `ptr`).
// During a graph capture, device frees are deferred (see
// ContextState::defer_free).
inline Status free_by_rule(ContextState& ctx, DevicePtr ptr, FreeRule rule) {
  switch (rule) {
    case FreeRule::stream:
      return ctx.allocator().free(ptr);
    case FreeRule::fence:
      // Batched behind a fence on every stream (core/ledger_fences.cpp,
      // CudaBackend::fence_record): no driver call here.
      return ctx.allocator().free_deferred(ptr);
    case FreeRule::device:
      break;
  }
  return free_after_device_sync(ctx, ptr);
}

// Completes deferred frees once no capture is in flight; called on the
// allocation and free paths (one relaxed load, inline, when nothing is
// deferred).
void settle_deferred_frees_now(ContextState& ctx);
inline void settle_deferred_frees(ContextState& ctx) {
  if (ctx.has_deferred()) [[unlikely]] settle_deferred_frees_now(ctx);
}

}  // namespace cachalloc::shim
