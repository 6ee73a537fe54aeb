// stream_watch.h — the driver calls that put work on a stream, watched for
// per-thread default streams.
//
// A per-thread default stream is a blocking stream of its own thread: two
// of them (two threads), or one beside a created blocking stream, are not
// ordered with each other, so free_sync:auto may no longer reuse plain
// frees at once (stream_order.h).  The shim sees such a stream only where
// the program names it: a launch, copy or memset through a _ptsz/_ptds
// entry point with stream 0 (programs built with --default-stream
// per-thread: cudart fetches both variants of every call at start-up, so
// the lookups alone say nothing), or through either entry point with
// CU_STREAM_PER_THREAD (CuPy's and numba's per-thread modes, cudaStreamPerThread).
//
// So those calls are wrapped — exported (programs linked against libcuda),
// through the dlsym hook and through cuGetProcAddress — and each wrapper
// looks at its stream argument before it tail-calls the driver: one or two
// compares in the common case.  A call that names the per-thread stream
// notes it in the current context, once per (thread, context), before the
// call enqueues anything.  Only calls that write device memory are wrapped
// (kernel and graph launches, copies, memsets, stream memory operations).
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

// The wrapper for an exported watched symbol ("cuLaunchKernel_ptsz"), or nullptr.
void* watch_wrapper_for_symbol(const char* name);

// The wrapper for a cuGetProcAddress lookup of a watched base name whose
// driver answer is `answer`, or nullptr.  The first answer at a version the
// wrapper's ABI covers is remembered and the wrapper forwards to it; a later
// lookup answered with another function (another ABI) is not redirected.
void* watch_wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags, void* answer);

// The calling thread named its per-thread default stream in work for the
// current context: noted there once per (thread, context).
void note_per_thread_stream() noexcept;

// How many distinct (thread, context) pairs were noted so far (for tests
// and the dump).
unsigned long per_thread_streams_noted();

}  // namespace cachalloc::shim
