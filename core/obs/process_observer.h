// process_observer.h — the one AllocatorObserver of a process.
//
// The shim installs ProcessObserver::instance() on every CachingAllocator it
// creates (set_observer()).  It does two things:
//  * timeline: when Config::trace is set, every TraceEvent is stamped with a
//    steady-clock time (ns) and stored in a bounded ring buffer of
//    Config::trace_max_entries records; when full, the oldest record is
//    overwritten and counted as dropped.  When trace is off, on_event()
//    returns after one relaxed load.
//  * out-of-memory report: on_oom() logs one readable message at error level
//    (format_oom_message()), with per-process usage from NVML when
//    libnvidia-ml.so.1 can be dlopen'ed (optional, degrades to nothing).
//    A condition that refuses every such request whatever the program does
//    (oom_repeat_reason(): a per_process_memory_fraction below the segment,
//    a request larger than the device) is printed once per device and then
//    only counted, with the largest need seen: repeated_ooms() for the stats
//    dump, repeated_oom_summary() for the line at exit.
//
// Lifetime: instance() is created on first use and never destroyed, so exit
// hooks can read it after static destructors have run.
// Thread safety: on_event may be called concurrently by allocators of
// different devices (each holds only its own lock); the ring has its own mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "config.h"
#include "observer.h"
#include "process_report.h"
#include "trace_ring.h"

namespace cachalloc::obs {

class ProcessObserver final : public AllocatorObserver {
 public:
  static ProcessObserver& instance();

  // Reads trace / trace_max_entries.  Call once before installing the
  // observer (the shim calls it when CUDA is first used); later calls replace
  // the ring (and drop what it held).
  void configure(const Config& config);

  void on_event(int device, const TraceEvent& event) override;
  void on_oom(int device, const OomReport& report) override;

  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }
  // A copy of the ring, oldest first, plus the number of records dropped.
  TraceRing::Contents trace_contents() const;
  // The repeating conditions seen so far (a copy).
  std::vector<RepeatedOom> repeated_ooms() const;

  // Public so tests can build their own (instance() is for the shim).
  ProcessObserver() { events_on_ = &tracing_; }

 private:
  std::atomic<bool> tracing_{false};
  mutable std::mutex mutex_;
  TraceRing ring_{0};
  mutable std::mutex oom_mutex_;  // on_oom runs on any thread, under one allocator's lock
  std::vector<RepeatedOom> repeats_;
};

// The reason an out-of-memory error will repeat for every such request
// ("per_process_memory_fraction", "larger_than_device"), or nullptr, and
// what it needed (the segment the fraction refused, or the request).
const char* oom_repeat_reason(const OomReport& report);
std::size_t oom_need(const OomReport& report);

// The line at exit for a condition counted more than once: how many
// allocations it refused, and the setting that would have served the
// largest of them ("at least ...").
std::string repeated_oom_summary(const RepeatedOom& repeat);

// The OOM message (one line per fact, PyTorch's spirit).  `nvml_lines` is the
// per-process usage text from nvml_process_usage(); empty when unavailable.
std::string format_oom_message(int device, const OomReport& report, const std::string& nvml_lines);

// "process PID uses N MiB" lines for `device` via NVML, or "" when
// libnvidia-ml.so.1 is absent or any call fails.  Never calls CUDA.
std::string nvml_process_usage(int device);

}  // namespace cachalloc::obs
