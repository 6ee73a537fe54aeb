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
// So every entry point that can name a stream is wrapped — exported
// (programs linked against libcuda), through the dlsym hook and through
// cuGetProcAddress — and each wrapper looks at its stream arguments before
// it calls the driver: one or two compares in the common case.  The list is
// not written by hand: gen_stream_calls.py derives it at build time from
// the toolkit's cudaTypedefs.h (every ABI of every entry point with a
// CUstream or CUlaunchConfig parameter, and every _ptsz/_ptds variant).
// An entry point those headers do not type (a newer driver's) is handed
// out behind a thunk that notes the calling thread's per-thread stream on
// every call (note_thunks.h).  A call that names the per-thread stream notes
// it in the current context, once per (thread, context), before the call
// enqueues anything.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

// What to hand out for dlsym(libcuda, name) whose driver answer is `sym`:
// the exported wrapper of a watched call's current ABI; nullptr for an
// entry point that names no stream; a thunk (note_thunks.h) for any other
// name (a per-thread variant or an ABI these headers do not type, a name
// they lack).
void* watch_wrapper_for_symbol(const char* name, void* sym);

// The same for a cuGetProcAddress lookup whose driver answer is `answer`.
// A lookup of a watched name above the headers' CUDA_VERSION is checked
// against the driver's answer at that version (a newer ABI gets a thunk).
// The first answer for an ABI is remembered and its wrapper forwards to it;
// a later lookup answered with another function gets a thunk instead.
void* watch_wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags, void* answer);

// A known driver entry point that names no stream in any ABI (a program
// that binds it at link time puts no work on a per-thread stream with it:
// link_imports.h).  False for names these headers lack.
bool names_no_stream(const char* name);

// The calling thread named its per-thread default stream in work for the
// current context: noted there once per (thread, context).
void note_per_thread_stream() noexcept;

// How many distinct (thread, context) pairs were noted so far (for tests
// and the dump).
unsigned long per_thread_streams_noted();

}  // namespace cachalloc::shim
