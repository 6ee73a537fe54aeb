// note_thunks.h — wrappers for driver entry points whose signature
// cachalloc does not know.
//
// A driver newer than the headers cachalloc was built with hands out entry
// points (new _ptsz variants, new ABIs of old names) that may put work on
// the calling thread's per-thread default stream.  Their parameters are
// unknown, so a typed wrapper cannot look at the stream; a thunk can still
// be put in front: it saves every argument register, notes the per-thread
// stream of the calling thread (the conservative answer: the call may have
// used it), restores the registers and jumps to the driver's function, so
// the callee sees exactly the caller's arguments, stack and return address.
//
// Noting too much costs memory (frees are fenced once two streams are
// known), never correctness; noting too little is what this prevents.
//
// x86-64 only (the assembly is there).  Elsewhere, or once all slots are
// used, note_thunk_for returns nullptr, the caller hands out the driver's
// function unwrapped and a warning names it (stream_watch.cpp).
#pragma once

namespace cachalloc::shim {

// What every thunk calls before it jumps: the caller's note (stream_watch.cpp
// passes its note_per_thread_stream), so that this file calls nothing above it.
using ThunkNote = void (*)() noexcept;

// A thunk forwarding to `target` (the same thunk for the same target), or
// nullptr when none can be made (another architecture, or all slots used:
// a warning says so once).  `note` becomes what the thunks call (the same
// function on every call), set before the thunk is handed out.
void* note_thunk_for(void* target, ThunkNote note) noexcept;

// How many thunks were handed out (for tests and the dump).
int note_thunks_used() noexcept;

// Calls through any thunk so far (for tests).
unsigned long note_thunk_calls() noexcept;

}  // namespace cachalloc::shim
