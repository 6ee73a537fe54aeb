// process_observer.cpp — see process_observer.h.
#include "process_observer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "log.h"

namespace cachalloc::obs {

namespace {

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace

ProcessObserver& ProcessObserver::instance() {
  // Leaked on purpose: exit hooks read it after static destructors ran.
  static ProcessObserver* const observer = new ProcessObserver();
  return *observer;
}

void ProcessObserver::configure(const Config& config) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool on = !config.trace.empty();
  ring_ = TraceRing(on ? config.trace_max_entries : 0);
  tracing_.store(on, std::memory_order_relaxed);
}

void ProcessObserver::on_event(int device, const TraceEvent& event) {
  if (!tracing_.load(std::memory_order_relaxed)) return;
  TimedEvent timed{steady_ns(), device, event};
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.push(timed);
}

void ProcessObserver::on_oom(int device, const OomReport& report) {
  const char* reason = oom_repeat_reason(report);
  if (reason != nullptr) {
    std::lock_guard<std::mutex> lock(oom_mutex_);
    for (RepeatedOom& r : repeats_) {
      if (r.device != device || std::strcmp(r.reason, reason) != 0) continue;
      ++r.count;  // printed already: counted
      r.largest_need = std::max(r.largest_need, oom_need(report));
      return;
    }
    repeats_.push_back({device, reason, 1, report.allowed, report.device_total, oom_need(report)});
  }
  Logger& log = logger();
  if (!log.should_log(LogLevel::err)) return;
  std::string msg = format_oom_message(device, report, nvml_process_usage(device));
  if (reason != nullptr)
    msg += obs::format(
        "\nLater out-of-memory errors on device {} for this reason are counted, not printed: their number and "
        "the setting that serves the largest of them are reported at exit and in the stats dump.",
        device);
  log.error("{}", msg);
}

std::vector<RepeatedOom> ProcessObserver::repeated_ooms() const {
  std::lock_guard<std::mutex> lock(oom_mutex_);
  return repeats_;
}

TraceRing::Contents ProcessObserver::trace_contents() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.contents();
}

}  // namespace cachalloc::obs
