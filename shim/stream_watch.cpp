// stream_watch.cpp — the watched calls (list below), their lookups, and the
// noting of a per-thread default stream.
#include "stream_watch.h"

#include <atomic>
#include <cstring>

#include "capture_tracking.h"
#include "context_registry.h"
#include "process_state.h"
#include "real_driver.h"
#include "stream_ids.h"

namespace cachalloc::shim {
namespace {

// Where a wrapper forwards to: `dl`, the exported symbol of the real
// libcuda (for the exported wrapper and the dlsym route), resolved at the
// first call; `proc`, the first cuGetProcAddress answer (for the wrapper
// handed out there).
struct Slots {
  std::atomic<void*> dl{nullptr};
  std::atomic<void*> proc{nullptr};
};

void* resolve_dl(Slots& s, const char* name) {
  void* fn = s.dl.load(std::memory_order_acquire);
  if (fn != nullptr) [[likely]] return fn;
  const RealDriver* d = real_driver();
  if (d == nullptr) return nullptr;
  fn = real_dlsym(d->handle, name);
  s.dl.store(fn, std::memory_order_release);
  return fn;
}

// A plain entry point runs on the per-thread stream only when named so; a
// _ptsz one also for stream 0.
inline bool names_per_thread(CUstream s) { return s == CU_STREAM_PER_THREAD; }
inline bool names_per_thread_ptsz(CUstream s) { return s == nullptr || s == CU_STREAM_PER_THREAD; }
inline CUstream config_stream(const CUlaunchConfig* c) { return c != nullptr ? c->hStream : CU_STREAM_LEGACY; }

std::atomic<unsigned long> g_noted{0};

}  // namespace

void note_per_thread_stream() noexcept {
  try {
    if (!serving(current_mode())) return;
    ContextState* ctx = current_context_state();
    if (ctx == nullptr) return;
    static constinit thread_local ContextState* t_noted = nullptr;
    if (t_noted == ctx) [[likely]] return;
    // Noted now, even during a capture: nothing may note it later.  During
    // a capture in this context the noting records nothing on the legacy
    // stream and queries nothing (stream_order.h, note (3)).
    t_noted = ctx;
    g_noted.fetch_add(1, std::memory_order_relaxed);
    ctx->note_stream(per_thread_stream_id(), /*non_blocking=*/false);
  } catch (...) {
    // Nothing may cross into the program; the stream stays unnoted.
  }
}

unsigned long per_thread_streams_noted() { return g_noted.load(std::memory_order_relaxed); }

}  // namespace cachalloc::shim

// ---- the list ----
//
// ASYNC(plain name, _ptsz name, lookup base name, first cudaVersion of this
//       ABI, (parameters), (arguments), stream expression)
// SYNC (_ptds name, lookup base name, first cudaVersion, (parameters), (arguments)):
//       synchronous calls, on the per-thread stream in their _ptds form only.
#define CACHALLOC_WATCHED_ASYNC(X)                                                                                   \
  X(cuLaunchKernel, cuLaunchKernel_ptsz, "cuLaunchKernel", 4000,                                                    \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem,     \
     CUstream s, void** params, void** extra),                                                                       \
    (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra), s)                                                         \
  X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000,                   \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem,     \
     CUstream s, void** params),                                                                                     \
    (f, gx, gy, gz, bx, by, bz, shmem, s, params), s)                                                                \
  X(cuLaunchKernelEx, cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060,                                             \
    (const CUlaunchConfig* config, CUfunction f, void** params, void** extra), (config, f, params, extra),          \
    config_stream(config))                                                                                           \
  X(cuGraphLaunch, cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, (CUgraphExec g, CUstream s), (g, s), s)              \
  X(cuMemcpyAsync, cuMemcpyAsync_ptsz, "cuMemcpyAsync", 4000,                                                       \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), s)                                   \
  X(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 3020,                                     \
    (CUdeviceptr dst, const void* src, size_t n, CUstream s), (dst, src, n, s), s)                                   \
  X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 3020,                                     \
    (void* dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), s)                                         \
  X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 3020,                                     \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), s)                                   \
  X(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 3020, (const CUDA_MEMCPY2D* p, CUstream s),    \
    (p, s), s)                                                                                                       \
  X(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, "cuMemcpy3DAsync", 3020, (const CUDA_MEMCPY3D* p, CUstream s),    \
    (p, s), s)                                                                                                       \
  X(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 4000,                                           \
    (CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s), (dst, dc, src, sc, n, s), \
    s)                                                                                                               \
  X(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz, "cuMemcpy3DPeerAsync", 4000,                                     \
    (const CUDA_MEMCPY3D_PEER* p, CUstream s), (p, s), s)                                                            \
  X(cuMemsetD8Async, cuMemsetD8Async_ptsz, "cuMemsetD8Async", 3020,                                                 \
    (CUdeviceptr d, unsigned char v, size_t n, CUstream s), (d, v, n, s), s)                                         \
  X(cuMemsetD16Async, cuMemsetD16Async_ptsz, "cuMemsetD16Async", 3020,                                              \
    (CUdeviceptr d, unsigned short v, size_t n, CUstream s), (d, v, n, s), s)                                        \
  X(cuMemsetD32Async, cuMemsetD32Async_ptsz, "cuMemsetD32Async", 3020,                                              \
    (CUdeviceptr d, unsigned int v, size_t n, CUstream s), (d, v, n, s), s)                                          \
  X(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 3020,                                           \
    (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s), (d, pitch, v, w, h, s), s)      \
  X(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 3020,                                        \
    (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s), (d, pitch, v, w, h, s), s)     \
  X(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 3020,                                        \
    (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s), (d, pitch, v, w, h, s), s)       \
  X(cuStreamWriteValue32_v2, cuStreamWriteValue32_v2_ptsz, "cuStreamWriteValue32", 11070,                           \
    (CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int fl), (s, a, v, fl), s)                                    \
  X(cuStreamWriteValue64_v2, cuStreamWriteValue64_v2_ptsz, "cuStreamWriteValue64", 11070,                           \
    (CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int fl), (s, a, v, fl), s)                                    \
  X(cuStreamBatchMemOp_v2, cuStreamBatchMemOp_v2_ptsz, "cuStreamBatchMemOp", 11070,                                 \
    (CUstream s, unsigned int n, CUstreamBatchMemOpParams* ops, unsigned int fl), (s, n, ops, fl), s)                \
  X(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz, "cuMemcpyBatchAsync", 13000,                                 \
    (CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t n, CUmemcpyAttributes* attrs, size_t* idxs,         \
     size_t nattrs, CUstream s),                                                                                     \
    (dsts, srcs, sizes, n, attrs, idxs, nattrs, s), s)                                                               \
  X(cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync_v2_ptsz, "cuMemcpy3DBatchAsync", 13000,                           \
    (size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long fl, CUstream s), (n, ops, fl, s), s)

#define CACHALLOC_WATCHED_SYNC(X)                                                                                    \
  X(cuMemcpy_ptds, "cuMemcpy", 4000, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))                   \
  X(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 3020, (CUdeviceptr dst, const void* src, size_t n), (dst, src, n))        \
  X(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 3020, (void* dst, CUdeviceptr src, size_t n), (dst, src, n))              \
  X(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 3020, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))        \
  X(cuMemcpy2D_v2_ptds, "cuMemcpy2D", 3020, (const CUDA_MEMCPY2D* p), (p))                                          \
  X(cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 3020, (const CUDA_MEMCPY2D* p), (p))                        \
  X(cuMemcpy3D_v2_ptds, "cuMemcpy3D", 3020, (const CUDA_MEMCPY3D* p), (p))                                          \
  X(cuMemcpyPeer_ptds, "cuMemcpyPeer", 4000,                                                                        \
    (CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n), (dst, dc, src, sc, n))                 \
  X(cuMemcpy3DPeer_ptds, "cuMemcpy3DPeer", 4000, (const CUDA_MEMCPY3D_PEER* p), (p))                                \
  X(cuMemsetD8_v2_ptds, "cuMemsetD8", 3020, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))                  \
  X(cuMemsetD16_v2_ptds, "cuMemsetD16", 3020, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n))               \
  X(cuMemsetD32_v2_ptds, "cuMemsetD32", 3020, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))                 \
  X(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 3020,                                                                     \
    (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h), (d, pitch, v, w, h))                         \
  X(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 3020,                                                                   \
    (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h), (d, pitch, v, w, h))                        \
  X(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 3020,                                                                   \
    (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h), (d, pitch, v, w, h))

// ---- the wrappers ----
//
// For each variant: an exported function (forwards to the `dl` slot) and a
// local one for cuGetProcAddress (forwards to the `proc` slot, always set
// before it is handed out).  No exception can arise in them.
#define EXPORT extern "C" __attribute__((visibility("default")))
using cachalloc::shim::note_per_thread_stream;
using cachalloc::shim::Slots;
using cachalloc::shim::config_stream;

#define CACHALLOC_FORWARD(slot_expr, PARAMS, ARGS)                        \
  using Fn = CUresult(*) PARAMS;                                          \
  void* fn = slot_expr;                                                   \
  if (fn == nullptr) [[unlikely]] return CUDA_ERROR_NOT_FOUND;            \
  return reinterpret_cast<Fn>(fn) ARGS

#define CACHALLOC_VARIANT(name, WATCH, PARAMS, ARGS)                                                 \
  static Slots name##_slots;                                                                         \
  EXPORT CUresult name PARAMS {                                                                      \
    WATCH;                                                                                           \
    CACHALLOC_FORWARD(cachalloc::shim::resolve_dl(name##_slots, #name), PARAMS, ARGS);              \
  }                                                                                                  \
  static CUresult name##_proc PARAMS {                                                               \
    WATCH;                                                                                           \
    CACHALLOC_FORWARD(name##_slots.proc.load(std::memory_order_relaxed), PARAMS, ARGS);             \
  }

#define CACHALLOC_DEFINE_ASYNC(plain, ptsz, base, version, PARAMS, ARGS, STREAM)                         \
  CACHALLOC_VARIANT(plain, if (cachalloc::shim::names_per_thread(STREAM)) [[unlikely]] note_per_thread_stream(), \
                    PARAMS, ARGS)                                                                            \
  CACHALLOC_VARIANT(ptsz,                                                                                    \
                    if (cachalloc::shim::names_per_thread_ptsz(STREAM)) [[unlikely]] note_per_thread_stream(),   \
                    PARAMS, ARGS)
#define CACHALLOC_DEFINE_SYNC(ptds, base, version, PARAMS, ARGS) \
  CACHALLOC_VARIANT(ptds, note_per_thread_stream(), PARAMS, ARGS)

CACHALLOC_WATCHED_ASYNC(CACHALLOC_DEFINE_ASYNC)
CACHALLOC_WATCHED_SYNC(CACHALLOC_DEFINE_SYNC)

// ---- the lookup table ----
namespace cachalloc::shim {
namespace {

struct Watched {
  const char* name;  // exported name
  const char* base;  // cuGetProcAddress base name
  int min_version;
  bool per_thread;   // the _ptsz/_ptds variant
  void* exported;
  void* proc;
  Slots* slots;
};

#define CACHALLOC_ENTRY_ASYNC(plain, ptsz, base, version, PARAMS, ARGS, STREAM)                                 \
  {#plain, base, version, false, reinterpret_cast<void*>(&::plain), reinterpret_cast<void*>(&::plain##_proc),  \
   &::plain##_slots},                                                                                          \
      {#ptsz, base, version, true, reinterpret_cast<void*>(&::ptsz), reinterpret_cast<void*>(&::ptsz##_proc),  \
       &::ptsz##_slots},
#define CACHALLOC_ENTRY_SYNC(ptds, base, version, PARAMS, ARGS) \
  {#ptds, base, version, true, reinterpret_cast<void*>(&::ptds), reinterpret_cast<void*>(&::ptds##_proc), &::ptds##_slots},

const Watched kWatched[] = {CACHALLOC_WATCHED_ASYNC(CACHALLOC_ENTRY_ASYNC) CACHALLOC_WATCHED_SYNC(CACHALLOC_ENTRY_SYNC)};

}  // namespace

void* watch_wrapper_for_symbol(const char* name) {
  for (const Watched& w : kWatched)
    if (std::strcmp(w.name, name) == 0) return w.exported;
  return nullptr;
}

void* watch_wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags, void* answer) {
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (const Watched& w : kWatched) {
    if (w.per_thread != per_thread || cuda_version < w.min_version || std::strcmp(w.base, symbol) != 0) continue;
    void* expected = nullptr;
    if (!w.slots->proc.compare_exchange_strong(expected, answer, std::memory_order_acq_rel) && expected != answer)
      return nullptr;  // another ABI answered first: left alone
    return w.proc;
  }
  return nullptr;
}

}  // namespace cachalloc::shim
