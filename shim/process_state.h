// process_state.h — whether cachalloc serves allocations in this process.
//
// The state is decided on the first call of a hook (never at load time;
// start_up.h starts it, handing down the steps of the floors above):
//   active    — CACHALLOC_CONF parsed, libcuda loaded: the cache serves.
//   disabled  — a bad CACHALLOC_CONF (its message printed once on stderr), or
//               no usable libcuda: every call goes to the driver unchanged.
//   forked    — a child of fork(): CUDA state does not survive fork, so the
//               child passes every call to the driver (pthread_atfork).
//   exiting   — exit() has begun (atexit handler): frees of cachalloc's
//               pointers become no-ops and no driver call is made any more.
//   passive   — as active, but this copy of the library was dlopen'ed
//               (PyTorch's pluggable allocator, python/cachalloc), not preloaded:
//               the caches serve only the pluggable ABI and the control API,
//               every hook passes to the driver (load_mode.h).
// Also the process-wide interposer counters and the timing of the driver
// calls made inside timed wrappers (the wrappers' own timer, on only with
// config.stats set, is start_up.h's).
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "config.h"
#include "obs/process_report.h"
#include "thread_counts.h"

namespace cachalloc::shim {

enum class Mode : int { uninitialized, active, disabled, forked, exiting, passive };

// What start-up needs of the floors above this one (start_up.h hands them
// down on the first call of a hook): this file calls nothing above it.
struct StartUpSteps {
  // Logging, the process observer, the exit hooks with their report source
  // (report_source.h).
  void (*start_observability)(const Config& config);
  // The first look at the link imports, before the first context's cache,
  // while the hooks are to serve (link_imports.h).
  void (*check_link_imports)() noexcept;
};

namespace detail {
extern std::atomic<Mode> g_mode;
// Decides the mode once (the first caller runs `steps`); the others wait
// for it.  Called by start_up.h's current_mode().
Mode initialize_mode(const StartUpSteps& steps);
// Trivially destructible and constant-initialized: usable before any
// constructor and after every destructor (hooks run at exit too).
extern constinit obs::InterposerCounters g_counters;
}  // namespace detail

// The mode as decided so far, without deciding it: uninitialized (never
// serving) until the first hook's call runs start-up.  For the floors below
// start_up.h, which no program call reaches first: the hooks above them
// call current_mode() (start_up.h), which decides it.
inline Mode mode_now() { return detail::g_mode.load(std::memory_order_acquire); }
inline bool serving(Mode m) { return m == Mode::active; }
// A child of fork(): the control and tag APIs answer at once, before any
// lock (one a parent thread held at the fork would never be released).
inline bool in_forked_child() { return detail::g_mode.load(std::memory_order_relaxed) == Mode::forked; }

// The cached pair's entry points (driver_ops.cpp) ask one word instead of
// the mode and the wrapper timing: true only while the mode is active and
// timing is off.  Written with them (process_state.cpp): set once
// initialization ends in that state, cleared before fork's child or exit
// changes the mode.  False sends a call the long way (current_mode(),
// WrapperTimer: start_up.h), which also initializes the process.
namespace detail {
extern std::atomic<bool> g_fast_lane;
}  // namespace detail
[[gnu::always_inline]] inline bool fast_lane() { return detail::g_fast_lane.load(std::memory_order_acquire); }
// Whether the caches exist for the pluggable ABI and the control API.
inline bool caching(Mode m) { return m == Mode::active || m == Mode::passive; }

// The effective configuration (defaults until initialized).
const Config& config();
// The CACHALLOC_CONF items that were not applied, one message each (issue 37).
const std::vector<std::string>& config_errors();

inline obs::InterposerCounters& counters() { return detail::g_counters; }

// -1 until the process is initialized, then 1 when config.stats asks for a
// report, else 0: one load tells the common case (0) from the others.
extern std::atomic<int> g_time_wrappers;

namespace detail {
// Whether this thread is inside a timed wrapper: DriverTimer counts only the
// driver calls made there, so that ns_in_driver is a part of ns_inside (the
// control API's and exit's driver calls are not in ns_inside).
extern constinit thread_local bool t_in_timed_wrapper __attribute__((tls_model("initial-exec")));

inline std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  const auto d = std::chrono::steady_clock::now() - since;
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}
}  // namespace detail

// Adds the wall time of one driver call made for the cache (CudaBackend) to
// counters().ns_in_driver when it is made inside a timed wrapper: the dump
// then tells cachalloc's own time from the driver's (a new segment's
// cuMemAlloc costs what it costs under any allocator).
class DriverTimer {
 public:
  explicit DriverTimer(obs::DriverCall which) : on_(detail::t_in_timed_wrapper), which_(which) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~DriverTimer() {
    if (!on_) return;
    counters().ns_in_driver.fetch_add(detail::elapsed_ns(start_), std::memory_order_relaxed);
    counters().driver_calls.fetch_add(1, std::memory_order_relaxed);
    counters().driver_calls_by[static_cast<int>(which_)].fetch_add(1, std::memory_order_relaxed);
  }
  DriverTimer(const DriverTimer&) = delete;
  DriverTimer& operator=(const DriverTimer&) = delete;

 private:
  bool on_;
  obs::DriverCall which_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace cachalloc::shim
