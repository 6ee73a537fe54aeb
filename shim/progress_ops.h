// progress_ops.h — the program's own waits, told to the cache as device
// progress: a cuStreamSynchronize or cuCtxSynchronize that returned shows
// the device past every block freed on that stream (or any) before the wait
// began, so cross-stream reuse may hand those to another stream with no
// device wait (core/steal_path.cpp, "Idle reuse").
//
// A wait is passed to the driver unchanged, and its answer returned as is;
// the cache only hears of a wait that succeeded, in the context it waited
// in.  Nothing is told while a capture is in flight, for a stream of another
// context, in a context the cache has not served (no state is made for a
// wait), or when the shim is not serving: then the cache simply knows less
// (a steal orders on the device instead).
//
// What it may touch: the context registry and each context's
// CachingAllocator by its progress calls; stream ids (stream_ids.h).
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

using RealStreamSync = CUresult (*)(CUstream);
using RealCtxSync = CUresult (*)(CUcontext);

// cuStreamSynchronize (ptsz: its _ptsz ABI, where handle 0 is the
// per-thread default stream), through `real`.
CUresult synchronize_stream(CUstream stream, bool ptsz, RealStreamSync real);
// cuCtxSynchronize (ctx nullptr: the current context) or
// cuCtxSynchronize_v2(ctx), through `real` (called with `ctx`).
CUresult synchronize_context(CUcontext ctx, RealCtxSync real);

}  // namespace cachalloc::shim
