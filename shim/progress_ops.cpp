// progress_ops.cpp — the program's stream and context waits as device
// progress for the cache (progress_ops.h says what and why).
#include "progress_ops.h"

#include "capture_tracking.h"
#include "context_registry.h"
#include "driver_ops.h"
#include "process_state.h"
#include "real_driver.h"
#include "stream_ids.h"

namespace cachalloc::shim {
namespace {

// The context state to tell, or nullptr (see progress_ops.h).  Never made
// here: a context the cache has not served has nothing to tell.
ContextState* state_to_tell(CUcontext ctx) {
  if (!serving(mode_now()) || capture_in_flight()) return nullptr;
  if (ctx == nullptr && (real_driver()->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr)) return nullptr;
  return live_state_of(ctx);
}

// A stream the legacy stream orders with (the legacy stream itself, a
// per-thread default stream, a blocking stream) may have relied on legacy
// work that its own synchronize need not wait for: the cache records a
// mark on it first.  A stream never noted as non-blocking counts as
// blocking (a record more, never less order).
bool ordered_with_legacy(const ContextState& state, StreamId id) {
  return id == kLegacyStreamId || is_per_thread_id(id) || !state.nonblocking_streams().contains(id);
}

}  // namespace

CUresult synchronize_stream(CUstream stream, bool ptsz, RealStreamSync real) {
  ContextState* state = state_to_tell(nullptr);
  if (state == nullptr || stream_of_other_context(*state, stream)) return real(stream);
  const StreamId id = stream_id(stream, ptsz);
  CachingAllocator& cache = state->allocator();
  CachingAllocator::ProgressPoint point;
  try {
    point = cache.progress_point(id, ordered_with_legacy(*state, id));
  } catch (...) {
    point = {};  // told nothing: the cache knows less
  }
  const CUresult r = real(stream);
  if (r != CUDA_SUCCESS || !point.valid) return r;
  try {
    cache.stream_synced(id, point);
  } catch (...) {
    // A mark entry could not be made: the cache knows less.
  }
  return r;
}

CUresult synchronize_context(CUcontext ctx, RealCtxSync real) {
  ContextState* state = state_to_tell(ctx);
  if (state == nullptr) return real(ctx);
  CachingAllocator& cache = state->allocator();
  const CachingAllocator::ProgressPoint point = cache.context_progress_point();
  const CUresult r = real(ctx);
  if (r == CUDA_SUCCESS) cache.all_synced(point);
  return r;
}

}  // namespace cachalloc::shim
