// free_policy.h — how a plain cuMemFree_v2 / cudaFree makes a block reusable.
//
// cuMemFree implicitly synchronizes, so programs free memory that kernels on
// other streams may still be using.  CACHALLOC_CONF free_sync picks the rule:
//   stream — allocator.free(): reuse at once for the next cuMemAlloc, safe
//            when all work runs in one stream order (PyTorch's rule).
//   device — cuCtxSynchronize, then free: cudaFree's own cost.
//   fence  — free_fenced() with an event on every live stream of the
//            context (legacy, created, this thread's per-thread stream);
//            cuMemAlloc blocks sit on a pseudo-stream (stream_ids.h), so the
//            legacy stream is fenced too.
//   auto   — stream while the context has seen only the legacy stream,
//            else fence; once a per-thread default stream of another thread
//            than the freeing one was used (which it cannot fence), device.
#pragma once

#include "context_registry.h"

namespace cachalloc::shim {

enum class FreeRule { stream, fence, device };

// The rule `policy` means for `ctx` right now.
FreeRule choose_free_rule(FreeSync policy, const ContextState& ctx);

// Frees `ptr` in `ctx` (current) by `rule`.  Returns the core's Status
// (kNotOwned when the allocator does not own `ptr`).
Status free_by_rule(ContextState& ctx, DevicePtr ptr, FreeRule rule);

}  // namespace cachalloc::shim
