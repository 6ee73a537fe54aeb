// stream_ids.h — CUstream handles as the core's StreamId, and back.
//
// The core keys blocks by StreamId.  Two handles mean different streams
// depending on who passes them: 0 is the legacy stream for a plain entry
// point but the calling thread's per-thread default stream for a _ptsz one,
// and CU_STREAM_PER_THREAD (0x2) names a different stream in every thread.
// So: the legacy stream is StreamId 0 (0 and CU_STREAM_LEGACY alike); a
// thread's per-thread default stream is an odd token made from the address
// of a thread_local (unique among live threads; real CUstream handles are
// aligned pointers, hence even); any other handle is its own value.
//
// A thread's token is drawn from a process-wide counter the first time the
// thread asks, never from an address: glibc gives a new thread the TLS block
// of one that exited, and a token the two shared would let blocks freed on
// the dead thread's stream (whose work may still run) be reused "in stream
// order" on the new thread's, a different stream.
#pragma once

#include <atomic>

#include "cuda_api.h"
#include "types.h"

namespace cachalloc::shim {

inline constexpr StreamId kLegacyStreamId = 0;
// The "stream" of blocks from cuMemAlloc_v2 / cudaMalloc.  Such memory has
// no stream: after a free, the next owner may use it on any stream, so the
// block's own stream must not be one the fence leaves out as "ordered
// already" (the core skips the block's stream when fencing).  Giving these
// blocks a pseudo-stream that no work runs on keeps the legacy stream in the
// fence.  2 never names a real stream here: CU_STREAM_PER_THREAD (0x2) is
// mapped to a per-thread token before it reaches the core.
inline constexpr StreamId kUnorderedStreamId = 2;

namespace detail {
// Odd, from 0x1001 on: never a legacy (0), unordered (2) or real (even) id.
inline std::atomic<StreamId> g_next_per_thread_id{0x1001};
inline constinit thread_local StreamId t_per_thread_id = 0;
[[gnu::noinline]] inline StreamId new_per_thread_stream_id() {
  t_per_thread_id = g_next_per_thread_id.fetch_add(2, std::memory_order_relaxed);
  return t_per_thread_id;
}
}  // namespace detail

// This thread's per-thread default stream token (unique for the process's
// lifetime, see above).
inline StreamId per_thread_stream_id() {
  const StreamId id = detail::t_per_thread_id;
  if (id != 0) [[likely]] return id;
  return detail::new_per_thread_stream_id();
}

inline bool is_per_thread_id(StreamId id) { return (id & 1u) != 0; }

// The StreamId of `s` as passed to a plain (ptsz = false) or _ptsz entry point.
inline StreamId stream_id(CUstream s, bool ptsz) {
  if (s == nullptr) return ptsz ? per_thread_stream_id() : kLegacyStreamId;
  if (s == CU_STREAM_LEGACY) return kLegacyStreamId;
  if (s == CU_STREAM_PER_THREAD) return per_thread_stream_id();
  return reinterpret_cast<StreamId>(s);
}

// The handle for a plain driver call from this thread; false when `id` is
// another thread's per-thread stream (which this thread cannot name) or the
// unordered pseudo-stream.
inline bool to_cu_stream(StreamId id, CUstream* out) {
  if (id == kUnorderedStreamId) return false;
  if (id == kLegacyStreamId) {
    *out = CU_STREAM_LEGACY;
  } else if (is_per_thread_id(id)) {
    if (id != per_thread_stream_id()) return false;
    *out = CU_STREAM_PER_THREAD;
  } else {
    *out = reinterpret_cast<CUstream>(id);
  }
  return true;
}

}  // namespace cachalloc::shim
