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
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

// After a successful begin on `stream` (as passed to a plain or _ptsz entry).
void capture_began(CUstream stream, bool ptsz, CUstreamCaptureMode mode);
// After the real end on `stream` returned `result`.
void capture_ended(CUstream stream, bool ptsz, CUresult result);
// Whether `stream` is capturing.  An error from the driver counts as
// capturing: the driver then sees the call and reports it.
bool stream_is_capturing(CUstream stream, bool ptsz);
// Whether any capture is in flight (one relaxed load).
bool capture_in_flight();
// Whether a global- or thread-local-mode capture is in flight.
bool strict_capture_in_flight();

}  // namespace cachalloc::shim
