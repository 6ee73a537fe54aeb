// capture_tracking.h — is this stream being captured into a CUDA graph?
//
// Allocations on a capturing stream must reach the real driver (they become
// graph memory nodes).  Asking the driver on every cuMemAllocAsync would add
// a driver call to the hot path, so the shim counts captures in flight
// through its cuStreamBeginCapture*/cuStreamEndCapture hooks and only asks
// cuStreamIsCapturing while that count is non-zero.  Streams that join a
// capture through events are caught by the same query.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

void capture_began();
// `result` is what the real cuStreamEndCapture returned.
void capture_ended(CUresult result);
// Whether `s` (as passed to a plain or _ptsz entry point) is capturing.  An
// error from the driver counts as capturing: the driver then sees the call.
bool stream_is_capturing(CUstream s, bool ptsz);

}  // namespace cachalloc::shim
