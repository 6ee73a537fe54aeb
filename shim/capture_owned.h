// capture_owned.h — allocations and frees while a graph capture is in flight.
//
// A graph replays the addresses its capture saw, so a block allocated or
// freed during a capture belongs to the capture (graph_owners.h): a free
// holds the block for the capture's token (core/ledger_owners.cpp) instead of
// making it reusable, whatever free_sync says, and an allocation marks the
// block with the token, so that its free after the capture is held too
// while a graph made from it lives.
//
// The driver refuses a bare cuMemAlloc/cuMemFree (cudaMalloc/cudaFree)
// during a global-mode capture (any thread) or a thread-local one of the
// calling thread, unless the thread exchanged its mode for relaxed
// (cuThreadExchangeStreamCaptureMode): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
// and the capture is invalidated.  The shim cannot see a thread's mode, so
// while a strict capture is in flight anywhere it asks the driver the same
// question: a real 1-byte cuMemAlloc_v2.  Refused, the program's call is
// refused with the driver's error (the probe invalidated the capture just
// as the program's own call would have) and nothing changes; else the byte
// is freed and the call is served.  Two driver calls per allocation or free
// during strict captures only; none during relaxed ones.
#pragma once

#include "context_registry.h"
#include "cuda_api.h"
#include "types.h"

namespace cachalloc::shim {

// CUDA_SUCCESS when the driver would allow a bare cuMemAlloc/cuMemFree from
// this thread now; else its refusal.  Call only while a capture is in
// flight (capture_in_flight()).
CUresult capture_permits_bare_call();

// A plain free (cuMemFree, cudaFree) or a free on a stream that is not
// capturing, during a capture: holds `ptr` for the captures' token.
// kNotOwned when no context owns `ptr` (the caller passes it on).
Status free_during_capture(DevicePtr ptr, bool bare);

// A bare allocation (cuMemAlloc, cudaMalloc) or one on a stream that is not
// capturing, during a capture, served from `ctx`: the block is marked with
// the captures' token.  Returns the driver's code.
CUresult alloc_during_capture(ContextState& ctx, DevicePtr* out, std::size_t size, StreamId stream, bool bare);

}  // namespace cachalloc::shim
