// free_policy.h — how a plain cuMemFree_v2 / cudaFree makes a block reusable.
//
// cuMemFree implicitly synchronizes, so programs free memory that kernels on
// other streams may still be using.  CACHALLOC_CONF free_sync picks the rule:
//   stream — allocator.free(): reuse at once for the next cuMemAlloc, safe
//            when all work runs in one stream order (PyTorch's rule).
//   device — cuCtxSynchronize, then free: cudaFree's own cost.
//   fence  — free_fenced() with one event on the legacy stream, which
//            completes only after all earlier work on every blocking stream
//            (per-thread default streams included); cuMemAlloc blocks sit on
//            a pseudo-stream (stream_ids.h) so the legacy stream is fenced.
//            Work on non-blocking streams is not ordered by the legacy
//            stream: while one is alive, fence means device.
//   auto   — stream while the context has seen only the legacy stream,
//            else fence.
//
// Why not an event on every live stream: a stream handle kept from earlier
// may have been destroyed by a path no hook sees (measured on the H200 with
// static cudart and four threads each creating and destroying a stream),
// and recording an event on a dead stream crashes inside libcuda.
#pragma once

#include "context_registry.h"

namespace cachalloc::shim {

enum class FreeRule { stream, fence, device };

// The rule `policy` means for `ctx` right now.
FreeRule choose_free_rule(FreeSync policy, const ContextState& ctx);

// Frees `ptr` in `ctx` (current) by `rule`.  Returns the core's Status
// (kNotOwned when the allocator does not own `ptr`).
// During a graph capture, fence and device frees are deferred (see
// ContextState::defer_free).
Status free_by_rule(ContextState& ctx, DevicePtr ptr, FreeRule rule);

// Completes deferred frees once no capture is in flight; called on the
// allocation and free paths (one relaxed load when nothing is deferred).
void settle_deferred_frees(ContextState& ctx);

}  // namespace cachalloc::shim
