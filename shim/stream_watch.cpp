// stream_watch.cpp — the watched calls (generated from the toolkit's
// headers by gen_stream_calls.py), their lookups, thunks for entry points
// newer than those headers, and the noting of a per-thread default stream.
#include "stream_watch.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

#include "capture_tracking.h"
#include "context_registry.h"
#include "log.h"
#include "note_thunks.h"
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

// One ABI of a watched entry point (the generated kWatchedCalls).
struct WatchedCall {
  const char* base;      // cuGetProcAddress base name
  int version;           // first cudaVersion of this ABI
  bool per_thread;       // the _ptsz/_ptds variant
  const char* exported;  // exported name of the current ABI, else nullptr
  void* exported_fn;
  void* proc_fn;
  Slots* slots;
};

}  // namespace

void note_per_thread_stream() noexcept {
  try {
    if (!serving(mode_now())) return;  // before start-up nothing is served: nothing to note
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

// ---- the generated wrappers ----
//
// For each ABI of each watched entry point: a lookup wrapper (forwards to
// the `proc` slot, always set before it is handed out) and, for the current
// ABI, an exported function (forwards to the `dl` slot).  No exception can
// arise in them.
#define EXPORT extern "C" __attribute__((visibility("default")))
using cachalloc::shim::config_stream;
using cachalloc::shim::names_per_thread;
using cachalloc::shim::names_per_thread_ptsz;
using cachalloc::shim::note_per_thread_stream;
using cachalloc::shim::resolve_dl;
using cachalloc::shim::Slots;
using cachalloc::shim::WatchedCall;

#include "stream_calls.inc"

// ---- the lookups ----
namespace cachalloc::shim {
namespace {

struct ByBase {
  bool operator()(const WatchedCall& a, const char* b) const { return std::strcmp(a.base, b) < 0; }
  bool operator()(const char* a, const WatchedCall& b) const { return std::strcmp(a, b.base) < 0; }
};

bool known_base(const char* base) {
  auto less = [](const char* a, const char* b) { return std::strcmp(a, b) < 0; };
  return std::binary_search(std::begin(kKnownBases), std::end(kKnownBases), base, less);
}

// "cuFoo_v2_ptsz" -> base "cuFoo", per-thread.  Returns false when the name
// is longer than any driver name.
bool split_symbol(const char* name, char (&base)[128], bool* per_thread) {
  size_t n = std::strlen(name);
  if (n >= sizeof base) return false;
  std::memcpy(base, name, n + 1);
  *per_thread = n > 5 && (std::strcmp(base + n - 5, "_ptsz") == 0 || std::strcmp(base + n - 5, "_ptds") == 0);
  if (*per_thread) base[n -= 5] = '\0';
  size_t i = n;
  while (i > 0 && base[i - 1] >= '0' && base[i - 1] <= '9') --i;
  if (i < n && i >= 2 && base[i - 1] == 'v' && base[i - 2] == '_') base[i - 2] = '\0';
  return true;
}

// An entry point whose signature these headers do not know: behind a thunk
// that notes the per-thread stream on every call; unwrapped, with a
// warning, where no thunk can be made.
void* unknown_entry(const char* name, void* answer) {
  if (void* t = note_thunk_for(answer, note_per_thread_stream)) return t;
  obs::logger().warn("driver entry point {} is newer than cachalloc's CUDA headers and could not be watched for "
                     "per-thread default streams",
                     name);
  return nullptr;
}

// Whether the driver's answer is an ABI these headers declare: a lookup
// above their CUDA_VERSION may name a newer one, so the driver is asked
// again at that version and must give the same function.  Asked only for
// watched names (a second lookup, only with a cudart newer than the headers).
bool abi_known(const char* symbol, void* answer, int version, cuuint64_t flags) {
  if (version <= CUDA_VERSION) return true;
  const RealDriver* d = real_driver();
  void* at_headers = nullptr;
  CUresult r = d->get_proc_address_v2 != nullptr
                   ? d->get_proc_address_v2(symbol, &at_headers, CUDA_VERSION, flags, nullptr)
                   : d->get_proc_address_v1(symbol, &at_headers, CUDA_VERSION, flags);
  return r == CUDA_SUCCESS && at_headers == answer;
}

}  // namespace

bool names_no_stream(const char* name) {
  char base[128];
  bool per_thread = false;
  if (!split_symbol(name, base, &per_thread) || per_thread || !known_base(base)) return false;
  auto [first, last] = std::equal_range(std::begin(kWatchedCalls), std::end(kWatchedCalls), base, ByBase{});
  return std::none_of(first, last, [](const WatchedCall& w) { return !w.per_thread; });
}

void* watch_wrapper_for_symbol(const char* name, void* sym) {
  for (const WatchedCall& w : kWatchedCalls)
    if (w.exported != nullptr && std::strcmp(w.exported, name) == 0) return w.exported_fn;
  // A known entry point that names no stream in any plain ABI (it may have
  // a watched _ptds twin): nothing to watch.  Otherwise a per-thread
  // variant, or an ABI of a watched call under a name other than the
  // current one (an older ABI), or a name these headers lack.
  return names_no_stream(name) ? nullptr : unknown_entry(name, sym);
}

void* watch_wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags, void* answer) {
  auto [first, last] = std::equal_range(std::begin(kWatchedCalls), std::end(kWatchedCalls), symbol, ByBase{});
  if (first == last) return known_base(symbol) ? nullptr : unknown_entry(symbol, answer);
  if (!abi_known(symbol, answer, cuda_version, flags)) return unknown_entry(symbol, answer);
  // The driver answers a per-thread lookup with the per-thread variant where
  // one exists; the newest ABI at or below the requested version.
  bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (per_thread && std::none_of(first, last, [](const WatchedCall& w) { return w.per_thread; })) per_thread = false;
  // Only a _ptds twin is watched (cuMemcpyDtoH): the plain ABIs name no stream.
  if (std::none_of(first, last, [&](const WatchedCall& w) { return w.per_thread == per_thread; })) return nullptr;
  const WatchedCall* best = nullptr;
  for (auto it = first; it != last; ++it)
    if (it->per_thread == per_thread && it->version <= cuda_version && (best == nullptr || it->version > best->version))
      best = &*it;
  if (best == nullptr) return unknown_entry(symbol, answer);
  void* expected = nullptr;
  if (!best->slots->proc.compare_exchange_strong(expected, answer, std::memory_order_acq_rel) && expected != answer)
    return unknown_entry(symbol, answer);  // another function answered this ABI before: not ours to type
  return best->proc_fn;
}

}  // namespace cachalloc::shim
