// capture_tracking.h — is this stream being captured into a CUDA graph?
//
// Allocations on a capturing stream must reach the real driver (they become
// graph memory nodes).  Asking the driver on every cuMemAllocAsync would add
// a driver call to the hot path, so the shim counts captures in flight
// through its cuStreamBeginCapture*/cuStreamEndCapture hooks and only asks
// cuStreamIsCapturing while that count is non-zero.  Streams that join a
// capture through events are caught by the same query.
//
// Captures in global or thread-local mode also forbid "unsafe" calls such as
// cuEventQuery while they run (the capture would be invalidated), so the
// backend asks strict_capture_in_flight() before querying events: pending
// frees then simply wait until the capture ends.
//
// Captures are also counted per context (the stream's, else the current
// one): where a decision concerns one context (whether its legacy stream
// may be recorded on, stream_order.h), a capture of another thread or
// device must not decide it.  The first capture in flight in a context
// lets that context record its capture-begin event (stream_order.h, (3)).
//
// A capture is counted *before* the real begin, under the gate below held
// exclusively: a call the capture would forbid, made by another thread,
// either completes before the capture begins or sees it counted.  Such
// calls (fence records on the legacy stream, event queries) hold the gate
// shared from their check through the call.
//
// This file is a low floor: the backends and the stream order read its
// counts and gate.  What a capture's begin and end mean to the layers above
// (a context's stream order, the graph owner tokens) reaches them through
// the CaptureListeners the hooks pass in (entry_points.cpp).
#pragma once

#include <atomic>
#include <shared_mutex>
#include <vector>
#include <cstdint>

#include "cuda_api.h"

namespace cachalloc::shim {

std::shared_mutex& capture_gate();

// What begins and ends of captures tell the layers above.
struct CaptureListeners {
  // Each capture gets an owner token (graph_owners.h: open_capture_token),
  // handed back when it ends with the graph it produced or captured into
  // (close_capture_token; nullptr graphs: none, the capture failed).
  std::uint64_t (*open_token)();
  void (*close_token)(std::uint64_t token, CUgraph graph, CUgraph into);
  // The first capture in flight in `ctx` is about to begin (another
  // context's strict one in flight: `strict_elsewhere`), and the last one in
  // it ended (ContextState::capture_beginning / captures_ended).  Called
  // with the captures' lock held.
  void (*context_capturing)(CUcontext ctx, bool strict_elsewhere);
  void (*context_done)(CUcontext ctx);
};

// Before the real begin on `stream` (as passed to a plain or _ptsz entry),
// with the gate held exclusively; undone by capture_abandoned if the begin
// fails.  `into`: the graph cuStreamBeginCaptureToGraph captures into.
void capture_began(const CaptureListeners& to, CUstream stream, bool ptsz, CUstreamCaptureMode mode,
                   CUgraph into = nullptr);
void capture_abandoned(const CaptureListeners& to, CUstream stream, bool ptsz);
// After the real end on `stream` returned `result` and, on success, `graph`.
void capture_ended(const CaptureListeners& to, CUstream stream, bool ptsz, CUresult result, CUgraph graph);
// The owner tokens of the captures a block of `ctx` allocated or freed now
// belongs to: those in flight in `ctx`, or every one in flight when none is
// (another device's kernels may reach it through peer access).
std::vector<std::uint64_t> capture_tokens_for(CUcontext ctx);
// Whether any capture is in flight (one relaxed load).
// Captures in flight in the process (capture_tracking.cpp).
extern std::atomic<int> g_captures;
inline bool capture_in_flight() { return g_captures.load(std::memory_order_relaxed) != 0; }
// Whether `stream` is capturing.  An error from the driver counts as
// capturing: the driver then sees the call and reports it.  Inline, the
// common answer (no capture in flight: one load); the driver is asked out
// of line.
bool stream_is_capturing_now(CUstream stream, bool ptsz);
[[gnu::always_inline]] inline bool stream_is_capturing(CUstream stream, bool ptsz) {
  if (!capture_in_flight()) [[likely]] return false;
  return stream_is_capturing_now(stream, ptsz);
}
// Captures in flight whose stream belongs to `ctx`.
int captures_in_context(CUcontext ctx);
// Whether a global- or thread-local-mode capture is in flight.
bool strict_capture_in_flight();

}  // namespace cachalloc::shim
