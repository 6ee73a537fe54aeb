// capture_tracking.cpp — captures in flight, and the query behind them.
#include "capture_tracking.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "real_driver.h"
#include "stream_ids.h"

namespace cachalloc::shim {

// Declared in the header: capture_in_flight() is inline on every pair.
std::atomic<int> g_captures{0};

namespace {

struct Capture {
  StreamId stream;
  bool strict;     // global or thread-local mode
  CUcontext ctx;   // the stream's context (else the current one at the begin)
  std::uint64_t token;  // its owner token (CaptureListeners::open_token)
  CUgraph into;         // cuStreamBeginCaptureToGraph's graph, else nullptr
};

// The context `stream` runs in, asked before the real begin (the stream is
// not capturing yet): its own for a created stream, else the current one.
CUcontext context_of_capture(CUstream stream) {
  const RealDriver* d = real_driver();
  CUcontext ctx = nullptr;
  if (stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD &&
      d->cuStreamGetCtx != nullptr && d->cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS && ctx != nullptr)
    return ctx;
  if (d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

int count_in_context_locked(CUcontext ctx);

std::atomic<int> g_strict{0};

// Captures are rare and short-lived: a locked vector is plenty.
std::mutex& captures_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::vector<Capture>& captures() {
  static auto* v = new std::vector<Capture>();
  return *v;
}

}  // namespace

std::shared_mutex& capture_gate() {
  static auto* gate = new std::shared_mutex();  // never destroyed: safe at exit
  return *gate;
}

void capture_began(const CaptureListeners& to, CUstream stream, bool ptsz, CUstreamCaptureMode mode, CUgraph into) {
  const bool strict = mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  const CUcontext ctx = context_of_capture(stream);
  const std::uint64_t token = to.open_token();
  std::lock_guard lock(captures_mutex());
  if (ctx != nullptr && count_in_context_locked(ctx) == 0) to.context_capturing(ctx, g_strict.load() != 0);
  captures().push_back({stream_id(stream, ptsz), strict, ctx, token, into});
  g_captures.fetch_add(1, std::memory_order_relaxed);
  if (strict) g_strict.fetch_add(1, std::memory_order_relaxed);
}

namespace {
// Forgets the capture on `stream`; its token, or 0 when none was counted.
std::uint64_t forget_capture(const CaptureListeners& to, CUstream stream, bool ptsz, CUgraph* into) {
  const StreamId id = stream_id(stream, ptsz);
  std::lock_guard lock(captures_mutex());
  auto& v = captures();
  auto it = std::find_if(v.begin(), v.end(), [&](const Capture& c) { return c.stream == id; });
  if (it == v.end()) return 0;
  if (it->strict) g_strict.fetch_sub(1, std::memory_order_relaxed);
  g_captures.fetch_sub(1, std::memory_order_relaxed);
  const CUcontext ctx = it->ctx;
  const std::uint64_t token = it->token;
  *into = it->into;
  v.erase(it);
  if (ctx != nullptr && count_in_context_locked(ctx) == 0) to.context_done(ctx);
  return token;
}
}  // namespace

// An end the driver refused as "not capturing" did not end one of ours; an
// invalidated capture did end, with no graph: its blocks are released (the
// driver made no graph that could replay them).  A successful end hands the
// token to the graph (and to the graph captured into).
void capture_ended(const CaptureListeners& to, CUstream stream, bool ptsz, CUresult result, CUgraph graph) {
  if (result == CUDA_ERROR_ILLEGAL_STATE || result == CUDA_ERROR_INVALID_HANDLE || result == CUDA_ERROR_INVALID_VALUE)
    return;
  CUgraph into = nullptr;
  const std::uint64_t token = forget_capture(to, stream, ptsz, &into);
  if (token == 0) return;
  // A failed end of a capture into an existing graph: that graph may hold
  // nodes captured before the failure, so it keeps the token (conservative).
  to.close_token(token, result == CUDA_SUCCESS ? graph : nullptr, into);
}

void capture_abandoned(const CaptureListeners& to, CUstream stream, bool ptsz) {
  CUgraph into = nullptr;
  const std::uint64_t token = forget_capture(to, stream, ptsz, &into);
  if (token != 0) to.close_token(token, nullptr, nullptr);
}

std::vector<std::uint64_t> capture_tokens_for(CUcontext ctx) {
  std::vector<std::uint64_t> in_ctx, all;
  std::lock_guard lock(captures_mutex());
  for (const Capture& c : captures()) {
    all.push_back(c.token);
    if (c.ctx == ctx) in_ctx.push_back(c.token);
  }
  return in_ctx.empty() ? all : in_ctx;
}

namespace {
int count_in_context_locked(CUcontext ctx) {
  int n = 0;
  for (const Capture& c : captures()) n += c.ctx == ctx ? 1 : 0;
  return n;
}
}  // namespace

int captures_in_context(CUcontext ctx) {
  if (!capture_in_flight()) [[likely]] return 0;
  std::lock_guard lock(captures_mutex());
  return count_in_context_locked(ctx);
}

bool stream_is_capturing_now(CUstream s, bool ptsz) {
  const RealDriver* d = real_driver();
  if (d->cuStreamIsCapturing == nullptr) return true;
  if (ptsz && s == nullptr) s = CU_STREAM_PER_THREAD;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->cuStreamIsCapturing(s, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

bool strict_capture_in_flight() { return g_strict.load(std::memory_order_relaxed) != 0; }

}  // namespace cachalloc::shim
