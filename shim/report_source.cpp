// report_source.cpp — cachalloc_collect_report(): the process state for the
// exit reports, and the start of observability at first CUDA use.
//
// Reads only the core's state and the counters: no driver call (it runs at
// exit and possibly in a signal handler).
#include <unistd.h>

#include <atomic>

#include <fstream>
#include <iterator>
#include <string>

#include "tags.h"
#include "context_registry.h"
#include "exit_hooks.h"
#include "host_cache.h"
#include "obs/atomic_file.h"
#include "obs/log.h"
#include "obs/path_template.h"
#include "obs/process_observer.h"
#include "process_state.h"
#include "report_source.h"

namespace cachalloc::shim {
namespace {

// argv joined by spaces, from /proc/self/cmdline (NUL-separated).
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw)
    if (c == '\0') c = ' ';
  return raw;
}

std::atomic<HostCache*> g_host_cache{nullptr};

void copy_counters(obs::ProcessReport* report) {
  const obs::InterposerCounters& c = counters();
  const auto calls = total_calls();
  for (std::size_t i = 0; i < report->calls.size(); ++i) report->calls[i] = calls[i];
  for (std::size_t i = 0; i < report->passthrough.size(); ++i)
    report->passthrough[i] = c.passthrough[i].load(std::memory_order_relaxed);
  report->ns_inside = c.ns_inside.load(std::memory_order_relaxed);
  report->ns_in_driver = c.ns_in_driver.load(std::memory_order_relaxed);
  report->driver_calls = c.driver_calls.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < report->driver_calls_by.size(); ++i)
    report->driver_calls_by[i] = c.driver_calls_by[i].load(std::memory_order_relaxed);
}

}  // namespace

// Report paths are checked at start-up, with the real reason, so that a
// report that cannot be written is known before the run, not after it.
void check_report_paths(const Config& cfg) {
  const struct {
    const char* key;
    const std::string& path;
  } paths[] = {{"stats", cfg.stats}, {"snapshot", cfg.snapshot}, {"trace", cfg.trace}};
  obs::TemplateContext ctx;
  bool have_ctx = false;
  for (const auto& p : paths) {
    if (p.path.empty() || (std::string_view(p.key) == "stats" && p.path == "stderr")) continue;
    if (!have_ctx) ctx = obs::current_template_context(), have_ctx = true;
    const std::string path = obs::expand_path_template(p.path, ctx);
    const std::string why = obs::check_directory_writable(path);
    if (!why.empty())
      obs::warn_stderr(std::string(p.key) + ":" + p.path + ": a file cannot be created there now: " + why +
                       " (checked at start-up; the report at exit will fail unless this changes)");
  }
}

void note_host_cache(HostCache* cache) { g_host_cache.store(cache, std::memory_order_release); }

void start_observability(const Config& cfg) {
  check_report_paths(cfg);
  obs::init_logging(cfg);
  obs::ProcessObserver::instance().configure(cfg);
  cachalloc_install_exit_hooks(cfg, cachalloc_collect_report);
}

}  // namespace cachalloc::shim

cachalloc::obs::ProcessReport cachalloc_collect_report(bool with_segments) {
  using namespace cachalloc;
  obs::ProcessReport report;
  try {
    report.config = shim::config();
    report.config_errors = shim::config_errors();
    report.pid = static_cast<int>(getpid());
    report.command_line = shim::command_line();
    report.job = obs::job_place_from_environment();
    for (shim::ContextState* ctx : shim::all_context_states()) {
      obs::DeviceReport d;
      d.device = ctx->device();
      d.stats = ctx->allocator().stats();
      d.device_total = ctx->device_total();
      d.context_destroyed = !ctx->alive();
      if (with_segments) d.segments = ctx->allocator().snapshot();
      for (const TagStats& t : ctx->allocator().tag_stats()) d.tags.push_back({shim::tag_display_name(t.tag), t});
      report.devices.push_back(std::move(d));
    }
    shim::copy_counters(&report);
    report.repeated_ooms = obs::ProcessObserver::instance().repeated_ooms();
    if (HostCache* h = shim::g_host_cache.load(std::memory_order_acquire)) {
      report.has_host = true;
      report.host = h->stats();
    }
  } catch (...) {
    // A partial report is better than none; never throw into the exit path.
  }
  return report;
}
