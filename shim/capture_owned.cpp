// capture_owned.cpp — allocations and frees during a capture (see the header).
#include "capture_owned.h"

#include "capture_tracking.h"
#include "graph_owners.h"
#include "real_driver.h"
#include "tags.h"

namespace cachalloc::shim {

CUresult capture_permits_bare_call() {
  // Relaxed captures forbid nothing; only a strict one can make the driver
  // refuse (capture_tracking.h counts them).
  if (!strict_capture_in_flight()) return CUDA_SUCCESS;
  const RealDriver* d = real_driver();
  CUdeviceptr probe = 0;
  const CUresult r = d->cuMemAlloc_v2(&probe, 1);
  if (r == CUDA_SUCCESS) {
    d->cuMemFree_v2(probe);
    return CUDA_SUCCESS;
  }
  // Refused for the capture: the driver's answer to the program's call too.
  // Any other failure (out of memory for one byte) says nothing about the
  // capture: the call is served.
  if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
      r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    return r;
  return CUDA_SUCCESS;
}

Status free_during_capture(DevicePtr ptr, bool bare) {
  ContextState* owner = find_owner(ptr);
  if (owner == nullptr) return kNotOwned;
  CachingAllocator& a = owner->allocator();
  // A double free or an interior pointer: the allocator's answer, nothing
  // held (a held block is freed for the program: a second free is refused).
  if (!a.is_live(ptr)) return a.free(ptr);
  if (bare) {
    const CUresult r = capture_permits_bare_call();
    if (r != CUDA_SUCCESS) return static_cast<Status>(r);  // the block stays the program's
  }
  const CUcontext ctx = owner->context();
  const std::uint64_t token = pin_token(ctx, capture_tokens_for(ctx), a.owner_of(ptr));
  // No token: every capture ended meanwhile and the block's owner is gone,
  // so nothing replays it: an ordinary free (its fence waits for the work).
  const Status s = token != 0 ? a.hold_for(ptr, token) : a.free_deferred(ptr);
  unpin_token(token);
  return s;
}

CUresult alloc_during_capture(ContextState& ctx, DevicePtr* out, std::size_t size, StreamId stream, bool bare) {
  if (bare) {
    const CUresult r = capture_permits_bare_call();
    if (r != CUDA_SUCCESS) return r;
  }
  CachingAllocator& a = ctx.allocator();
  DevicePtr p = 0;
  const Status s = tagged_malloc(a, &p, size, stream);
  if (s != kSuccess) return static_cast<CUresult>(s);
  const CUcontext c = ctx.context();
  const std::uint64_t token = pin_token(c, capture_tokens_for(c), 0);
  if (token != 0) a.mark_owner(p, token);
  unpin_token(token);
  *out = p;
  return CUDA_SUCCESS;
}

}  // namespace cachalloc::shim
