// start_up.h — the hooks' view of the process state: the first call of a
// hook starts the process up (process_state.h's states), handing down what
// start-up needs of the floors above process_state (start_up.cpp).
//
// Everything that a program's call can reach first includes this file:
// the entry points, the route rooms (driver_ops.h, host_ops.h), the control,
// tag, pause and pluggable APIs.  The floors below it (process_state,
// context_registry, link_imports, report_source, stream_watch, exit_hooks)
// read the mode with mode_now() and never start anything.
#pragma once

#include "process_state.h"

namespace cachalloc::shim {

namespace detail {
// Runs start-up once (process_state.cpp's initialize_mode with the steps of
// the floors above it) and returns the mode it decided.
[[gnu::noinline, gnu::cold]] Mode start_up();
// The first call of a process initializes it here (its own driver calls,
// the first segment's, are timed too), then says whether timing is on.
[[gnu::noinline, gnu::cold]] bool time_wrappers_after_init();
}  // namespace detail

// Starts up on first call; afterwards one load, inline (every hook asks).
inline Mode current_mode() {
  const Mode m = mode_now();
  if (m != Mode::uninitialized) [[likely]] return m;
  return detail::start_up();
}

// Adds the wall time of a wrapper to counters().ns_inside when timing is on.
// Inline only the test of the common case (timing off); starting and
// stopping are out of line so that the wrappers stay small.
class WrapperTimer {
 public:
  WrapperTimer() {
    const int timing = g_time_wrappers.load(std::memory_order_relaxed);
    if (timing == 0) [[likely]] return;
    if (timing > 0 || detail::time_wrappers_after_init()) start();
  }
  ~WrapperTimer() {
    if (on_) [[unlikely]] stop();
  }
  WrapperTimer(const WrapperTimer&) = delete;
  WrapperTimer& operator=(const WrapperTimer&) = delete;

 private:
  [[gnu::noinline]] void start() {
    on_ = true;
    outer_ = detail::t_in_timed_wrapper;
    detail::t_in_timed_wrapper = true;
    start_ = std::chrono::steady_clock::now();
  }
  [[gnu::noinline]] void stop() {
    counters().ns_inside.fetch_add(detail::elapsed_ns(start_), std::memory_order_relaxed);
    detail::t_in_timed_wrapper = outer_;
  }

  bool on_ = false;
  bool outer_ = false;
  std::chrono::steady_clock::time_point start_{};
};

// Counts one entry and times the wrapper: `ENTRY_SCOPE(cuMemAlloc_v2);`
#define CACHALLOC_ENTRY(name)                                   \
  ::cachalloc::shim::count_call(::cachalloc::obs::Entry::name); \
  ::cachalloc::shim::WrapperTimer cachalloc_timer_

}  // namespace cachalloc::shim
