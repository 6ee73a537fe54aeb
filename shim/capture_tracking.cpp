// capture_tracking.cpp — captures in flight, and the query behind them.
#include "capture_tracking.h"

#include <atomic>

#include "real_driver.h"

namespace cachalloc::shim {
namespace {

std::atomic<int> g_captures{0};

}  // namespace

void capture_began() { g_captures.fetch_add(1, std::memory_order_relaxed); }

// An end that the driver refused as "not capturing" did not end one of ours.
void capture_ended(CUresult result) {
  if (result == CUDA_ERROR_ILLEGAL_STATE || result == CUDA_ERROR_INVALID_HANDLE || result == CUDA_ERROR_INVALID_VALUE)
    return;
  int n = g_captures.load(std::memory_order_relaxed);
  while (n > 0 && !g_captures.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
  }
}

bool stream_is_capturing(CUstream s, bool ptsz) {
  if (g_captures.load(std::memory_order_relaxed) == 0) [[likely]] return false;
  const RealDriver* d = real_driver();
  if (d->cuStreamIsCapturing == nullptr) return true;
  if (ptsz && s == nullptr) s = CU_STREAM_PER_THREAD;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->cuStreamIsCapturing(s, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace cachalloc::shim
