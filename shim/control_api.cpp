// control_api.cpp — the public control API (include/cachalloc.h).
//
// Programs call these while cachalloc serves them: empty the cache, read the
// statistics (JSON, or torch.cuda.memory_summary()'s table), reset peaks and
// accumulated counts, write a snapshot, record a block's use on a stream,
// check the invariants, cap the pluggable ABI's memory, find a block's base
// allocation.  Every function is extern "C", catches
// everything, and returns a CUresult-numbered code.
//
// "Not active yet" must be answered without initializing anything (no
// dlopen of libcuda, no CACHALLOC_CONF parse): process_state's
// current_mode() initializes on its first call.  A ContextState exists only
// after a hook (active mode) or the pluggable ABI (active or passive mode,
// pluggable_api.cpp) served an allocation, so "no state at all" means
// cachalloc has not done anything yet; once one exists, the mode is decided
// and current_mode() is a plain load.  The memory fraction functions are
// settings and work before that.
#include "cachalloc.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "capture_tracking.h"
#include "context_registry.h"
#include "graph_owners.h"
#include "guarded.h"
#include "host_ops.h"
#include "obs/atomic_file.h"
#include "obs/dump_json.h"
#include "obs/path_template.h"
#include "obs/summary_table.h"
#include "primary_contexts.h"
#include "process_state.h"
#include "start_up.h"
#include "real_driver.h"
#include "report_source.h"
#include "stream_ids.h"

#define CACHALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace cachalloc::shim {
namespace {

static_assert(CACHALLOC_ERROR_INVALID_VALUE == CUDA_ERROR_INVALID_VALUE);
static_assert(CACHALLOC_ERROR_OUT_OF_MEMORY == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(CACHALLOC_ERROR_NOT_INITIALIZED == CUDA_ERROR_NOT_INITIALIZED);
static_assert(CACHALLOC_ERROR_DEINITIALIZED == CUDA_ERROR_DEINITIALIZED);
static_assert(CACHALLOC_ERROR_INVALID_DEVICE == CUDA_ERROR_INVALID_DEVICE);
static_assert(CACHALLOC_ERROR_OPERATING_SYSTEM == CUDA_ERROR_OPERATING_SYSTEM);
static_assert(CACHALLOC_ERROR_ILLEGAL_STATE == CUDA_ERROR_ILLEGAL_STATE);
static_assert(CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
static_assert(CACHALLOC_ERROR_UNKNOWN == CUDA_ERROR_UNKNOWN);

// What a call may do in the current state.
enum class Need {
  driver,  // reaches the driver or changes what the program sees: active only
  report,  // only reads (or resets counters of) the core's state: also while exiting
};

// 0 when a call of kind `need` may run now; never initializes the process state.
int check_state(Need need) {
  if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;  // before the registry's lock
  if (all_context_states().empty()) return CACHALLOC_ERROR_NOT_INITIALIZED;
  const Mode m = current_mode();  // decided already: a state exists
  if (m == Mode::passive) check_primary_contexts();  // no hook saw a reset: retire a destroyed context's cache first
  if (caching(m)) return CACHALLOC_SUCCESS;  // preloaded (active) or dlopen'ed (passive)
  if (m == Mode::exiting) return need == Need::report ? CACHALLOC_SUCCESS : CACHALLOC_ERROR_DEINITIALIZED;
  return CACHALLOC_ERROR_NOT_INITIALIZED;  // disabled, forked
}

// The live context states of `device` (-1: all live ones).
std::vector<ContextState*> live_states_of(int device) {
  std::vector<ContextState*> out;
  for (ContextState* s : all_context_states())
    if (s->alive() && (device == -1 || s->device() == device)) out.push_back(s);
  return out;
}

// Runs `body` (returning an int code), turning exceptions into codes.
template <typename Body>
int api_guarded(Body&& body) noexcept {
  return guarded(CACHALLOC_ERROR_UNKNOWN, CACHALLOC_ERROR_OUT_OF_MEMORY, std::forward<Body>(body));
}

// Copies `text` into buf[0, len) NUL-terminated, truncating.
void copy_truncated(char* buf, std::size_t len, const std::string& text) {
  if (buf == nullptr || len == 0) return;
  const std::size_t n = std::min(len - 1, text.size());
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

// Copies `text` and its NUL into buf when they fit; else the size needed as
// decimal digits and CACHALLOC_ERROR_INVALID_VALUE (cachalloc_stats_json's
// protocol).
int copy_out(char* buf, std::size_t len, const std::string& text) {
  if (buf == nullptr || len < text.size() + 1) {
    copy_truncated(buf, len, std::to_string(text.size() + 1));
    return CACHALLOC_ERROR_INVALID_VALUE;
  }
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return CACHALLOC_SUCCESS;
}

std::string current_stats_json() {
  const obs::ProcessReport report = cachalloc_collect_report(false);
  return obs::stats_json(report, obs::current_template_context().host);
}

// Whether the program's stream `s` is non-blocking (for the free policy's
// stream bookkeeping, as the allocation path notes a stream's first use).
bool is_nonblocking(CUstream s) {
  const RealDriver* d = real_driver();
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || d->cuStreamGetFlags == nullptr)
    return false;
  unsigned int flags = 0;
  return d->cuStreamGetFlags(s, &flags) == CUDA_SUCCESS && (flags & CU_STREAM_NON_BLOCKING) != 0;
}

// Whether `s` is a created stream of another context than `owner`.  The
// default streams name the owner's own.  Not asked during a capture (a
// query can invalidate a thread-local one).
bool stream_of_other_context(const ContextState& owner, CUstream s) {
  const RealDriver* d = real_driver();
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || d->cuStreamGetCtx == nullptr ||
      capture_in_flight())
    return false;
  CUcontext ctx = nullptr;
  return d->cuStreamGetCtx(s, &ctx) == CUDA_SUCCESS && ctx != nullptr && ctx != owner.context();
}

}  // namespace
}  // namespace cachalloc::shim

using namespace cachalloc;
using namespace cachalloc::shim;

CACHALLOC_EXPORT int cachalloc_empty_cache(int device) {
  return api_guarded([&] {
    if (device < -1) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::driver); st != CACHALLOC_SUCCESS) return st;
    // empty_cache waits on events and frees memory: unsafe calls that would
    // invalidate a global- or thread-local-mode capture.
    if (strict_capture_in_flight()) return CACHALLOC_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    const std::vector<ContextState*> states = live_states_of(device);
    if (states.empty()) return CACHALLOC_ERROR_INVALID_DEVICE;
    const RealDriver* d = real_driver();
    for (ContextState* s : states) {
      ContextGuard guard(d, s->context());
      s->allocator().empty_cache();
    }
    // Pinned host memory belongs to no device: every device (-1) empties it.
    if (HostCache* h = host_cache_if_any(); h != nullptr && device == -1) h->empty_cache();
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_stats_json_size(size_t* needed) {
  return api_guarded([&] {
    if (needed == nullptr) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    *needed = current_stats_json().size() + 1;
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_stats_json(char* buf, size_t len) {
  return api_guarded([&] {
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    return copy_out(buf, len, current_stats_json());
  });
}

CACHALLOC_EXPORT int cachalloc_reset_peak_stats(int device) {
  return api_guarded([&] {
    if (device < -1) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    const std::vector<ContextState*> states = live_states_of(device);
    if (states.empty()) return CACHALLOC_ERROR_INVALID_DEVICE;
    for (ContextState* s : states) s->allocator().reset_peak_stats();
    if (HostCache* h = host_cache_if_any(); h != nullptr && device == -1) h->reset_peak_stats();
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_snapshot(const char* path) {
  return api_guarded([&] {
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    const std::string tmpl = path != nullptr && path[0] != '\0' ? std::string(path) : config().snapshot;
    if (tmpl.empty()) return CACHALLOC_ERROR_INVALID_VALUE;
    const obs::ProcessReport report = cachalloc_collect_report(true);
    const obs::TemplateContext ctx = obs::current_template_context();
    const std::string target = obs::expand_path_template(tmpl, ctx);
    std::string error;
    if (!obs::atomic_write_file(target, obs::snapshot_json(report, ctx.host), &error)) {
      obs::warn_stderr("cachalloc_snapshot: cannot write " + target + ": " + error);
      return CACHALLOC_ERROR_OPERATING_SYSTEM;
    }
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_record_stream(void* ptr, struct CUstream_st* stream) {
  return api_guarded([&] {
    if (ptr == nullptr) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::driver); st != CACHALLOC_SUCCESS) return st;
    const auto p = reinterpret_cast<DevicePtr>(ptr);
    ContextState* owner = find_owner(p);
    if (owner == nullptr) return CACHALLOC_ERROR_INVALID_VALUE;
    if (stream_of_other_context(*owner, stream)) return CACHALLOC_ERROR_INVALID_VALUE;
    const StreamId id = stream_id(stream, false);
    const Status s = owner->allocator().record_stream(p, id);
    if (s != kSuccess) return CACHALLOC_ERROR_INVALID_VALUE;  // not a live block (interior pointer, freed)
    // As the allocation path does for a stream's first use: the free policy
    // learns that a stream other than the legacy one is in play (and which
    // non-blocking streams a plain free must synchronize with).
    if (id != kLegacyStreamId && !capture_in_flight()) owner->note_stream(id, is_nonblocking(stream));
    return CACHALLOC_SUCCESS;
  });
}

// A string literal from meson's project version (shim/meson.build).
CACHALLOC_EXPORT const char* cachalloc_version(void) { return CACHALLOC_VERSION_STRING; }

CACHALLOC_EXPORT int cachalloc_validate(char* msg, size_t len) {
  return api_guarded([&] {
    if (msg == nullptr && len != 0) return CACHALLOC_ERROR_INVALID_VALUE;
    copy_truncated(msg, len, "");
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    for (ContextState* s : live_states_of(-1)) {
      try {
        s->allocator().validate();
      } catch (const InvariantError& e) {
        copy_truncated(msg, len, "device " + std::to_string(s->device()) + ": " + e.what());
        return CACHALLOC_ERROR_ILLEGAL_STATE;
      }
    }
    if (const char* broken = check_graph_owners()) {
      copy_truncated(msg, len, std::string("graph owner tokens: ") + broken);
      return CACHALLOC_ERROR_ILLEGAL_STATE;
    }
    if (HostCache* h = host_cache_if_any()) {
      if (const std::string broken = h->validate(); !broken.empty()) {
        copy_truncated(msg, len, "pinned host cache: " + broken);
        return CACHALLOC_ERROR_ILLEGAL_STATE;
      }
    }
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_reset_accumulated_stats(int device) {
  return api_guarded([&] {
    if (device < -1) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    const std::vector<ContextState*> states = live_states_of(device);
    if (states.empty()) return CACHALLOC_ERROR_INVALID_DEVICE;
    for (ContextState* s : states) s->allocator().reset_accumulated_stats();
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_summary(int device, char* buf, size_t len) {
  return api_guarded([&] {
    if (device < -1) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    const obs::ProcessReport report = cachalloc_collect_report(false);
    if (device == -1) return copy_out(buf, len, obs::summary_text(report));
    std::string text;
    for (const obs::DeviceReport& d : report.devices)
      if (d.device == device && !d.context_destroyed) text += obs::device_table(d.device, d.stats) + obs::tag_table(d);
    if (text.empty()) return CACHALLOC_ERROR_INVALID_DEVICE;
    return copy_out(buf, len, text);
  });
}

// A setting, not a call on a cache: it may be made before the first
// allocation (as torch.cuda.set_per_process_memory_fraction may).
CACHALLOC_EXPORT int cachalloc_set_memory_fraction(double fraction, int device) {
  return api_guarded([&] {
    if (!(fraction > 0.0 && fraction <= 1.0) || device < -1) return CACHALLOC_ERROR_INVALID_VALUE;
    if (in_forked_child()) return CACHALLOC_ERROR_NOT_INITIALIZED;
    if (!all_context_states().empty()) {
      const Mode m = current_mode();  // decided already: a state exists
      if (!caching(m) && m != Mode::exiting) return CACHALLOC_ERROR_NOT_INITIALIZED;
    }
    return set_memory_fraction_override(device, fraction) ? CACHALLOC_SUCCESS : CACHALLOC_ERROR_INVALID_DEVICE;
  });
}

CACHALLOC_EXPORT int cachalloc_get_memory_fraction(int device, double* fraction) {
  return api_guarded([&] {
    if (fraction == nullptr || device < 0) return CACHALLOC_ERROR_INVALID_VALUE;
    if (device >= kMaxFractionDevices) return CACHALLOC_ERROR_INVALID_DEVICE;
    const double f = memory_fraction_override(device);
    // Before initialization config() holds the defaults (fraction 1).
    *fraction = f > 0.0 ? f : config().per_process_memory_fraction;
    return CACHALLOC_SUCCESS;
  });
}

CACHALLOC_EXPORT int cachalloc_get_base_allocation(void* ptr, void** base, size_t* size) {
  return api_guarded([&] {
    if (ptr == nullptr || base == nullptr) return CACHALLOC_ERROR_INVALID_VALUE;
    if (const int st = check_state(Need::report); st != CACHALLOC_SUCCESS) return st;
    const auto p = reinterpret_cast<DevicePtr>(ptr);
    ContextState* owner = find_owner(p);
    AddressInfo info;
    if (owner == nullptr || owner->allocator().query(p, &info) != kSuccess || !info.live)
      return CACHALLOC_ERROR_INVALID_VALUE;
    if (current_mode() == Mode::active) {
      // The hooks make every block look like its own cuMemAlloc to the driver
      // calls that describe allocations (address ranges, IPC).
      *base = reinterpret_cast<void*>(info.block);
      if (size != nullptr) *size = info.requested;
    } else {
      *base = reinterpret_cast<void*>(info.segment);
      if (size != nullptr) *size = info.segment_size;
    }
    return CACHALLOC_SUCCESS;
  });
}
