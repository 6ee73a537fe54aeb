// reports.cpp — see reports.h.  Each report is built in memory, then written
// in one go (stderr) or atomically (files); a failure is one warning.
#include "reports.h"

#include <pthread.h>
#include <signal.h>

#include <string>

#include "atomic_file.h"
#include "dump_json.h"
#include "log.h"
#include "path_template.h"
#include "process_observer.h"
#include "summary_table.h"
#include "trace_json.h"

namespace cachalloc::obs {

namespace {

// A path as a warning shows it: at most 200 bytes of it (a path template is
// user text of any length).
std::string shown_path(const std::string& path) {
  constexpr std::size_t kShown = 200;
  if (path.size() <= kShown) return path;
  return path.substr(0, kShown) + "... (" + std::to_string(path.size()) + " bytes)";
}

// `key` is the CACHALLOC_CONF key that named the path, for the remedy.
void write_report_file(const char* what, const char* key, const std::string& tmpl, const TemplateContext& ctx,
                       const std::string& content) {
  std::string path = expand_path_template(tmpl, ctx);
  std::string error;
  if (!atomic_write_file(path, content, &error))
    warn_stderr(std::string("cannot write the ") + what + " to " + shown_path(path) + ": " + error +
                ". To get it, set " + key + " in CACHALLOC_CONF to a path in an existing, writable directory "
                "(cachalloc creates no directories and never writes through a symbolic link); the program "
                "itself is not affected.");
}

// While a report is built and written, the signals that write reports
// (SIGTERM, SIGINT, the snapshot signal) wait: one arriving now would start
// another report from inside this one (two writers, locks and malloc taken
// twice), or end the process with the file half done.  It is delivered when
// the report is complete, so every file is whole or absent.  Per thread:
// another thread may still take it, and then this report is simply cut
// short before its rename (the file stays absent or the previous one).
class ReportSignalsHeld {
 public:
  explicit ReportSignalsHeld(const Config& config) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (config.snapshot_signal > 0) sigaddset(&set, config.snapshot_signal);
    held_ = pthread_sigmask(SIG_BLOCK, &set, &previous_) == 0;
  }
  ~ReportSignalsHeld() {
    if (held_) pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  ReportSignalsHeld(const ReportSignalsHeld&) = delete;
  ReportSignalsHeld& operator=(const ReportSignalsHeld&) = delete;

 private:
  sigset_t previous_{};
  bool held_ = false;
};

void write_stats(const ProcessReport& r, const TemplateContext& ctx) {
  if (r.config.stats.empty()) return;
  if (r.config.stats == "stderr") {
    write_stderr(summary_text(r));
    return;
  }
  write_report_file("stats dump", "stats", r.config.stats, ctx, stats_json(r, ctx.host));
}

void write_snapshot_file(const ProcessReport& r, const TemplateContext& ctx) {
  if (r.config.snapshot.empty()) return;
  write_report_file("snapshot", "snapshot", r.config.snapshot, ctx, snapshot_json(r, ctx.host));
}

void write_trace(const ProcessReport& r, const TraceRing::Contents& trace, const TemplateContext& ctx) {
  if (r.config.trace.empty()) return;
  write_report_file("trace", "trace", r.config.trace, ctx, trace_json(trace, r.pid));
}

// The conditions ProcessObserver printed once and then counted: one line
// each at exit, at error level like the message itself.
void log_repeated_ooms(const ProcessReport& r) {
  Logger& log = logger();
  if (!log.should_log(LogLevel::err)) return;
  for (const RepeatedOom& rep : r.repeated_ooms)
    if (rep.count > 1) log.error("{}", repeated_oom_summary(rep));
  log.flush();
}

// Every report is attempted even if an earlier one failed.
template <typename Fn>
void guarded(const char* what, Fn fn) {
  try {
    fn();
  } catch (...) {
    warn_stderr(std::string("failed to build the ") + what + " (out of host memory?)");
  }
}

}  // namespace

void write_exit_reports(const ProcessReport& report, const TraceRing::Contents& trace) {
  ReportSignalsHeld held(report.config);
  guarded("reports", [&] {
    TemplateContext ctx = current_template_context();  // one %d for all files of this exit
    guarded("messages", [&] { log_repeated_ooms(report); });
    guarded("stats dump", [&] { write_stats(report, ctx); });
    guarded("snapshot", [&] { write_snapshot_file(report, ctx); });
    guarded("trace", [&] { write_trace(report, trace, ctx); });
  });
}

void write_exit_reports(const ProcessReport& report) {
  ReportSignalsHeld held(report.config);
  guarded("trace", [&] {
    TraceRing::Contents trace;
    if (!report.config.trace.empty()) trace = ProcessObserver::instance().trace_contents();
    write_exit_reports(report, trace);
  });
}

void write_snapshot(const ProcessReport& report) {
  ReportSignalsHeld held(report.config);
  guarded("snapshot", [&] { write_snapshot_file(report, current_template_context()); });
}

}  // namespace cachalloc::obs
