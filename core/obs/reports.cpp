// reports.cpp — see reports.h.  Each report is built in memory, then written
// in one go (stderr) or atomically (files); a failure is one warning.
#include "reports.h"

#include <string>

#include "atomic_file.h"
#include "dump_json.h"
#include "path_template.h"
#include "process_observer.h"
#include "summary_table.h"
#include "trace_json.h"

namespace cachalloc::obs {

namespace {

void write_report_file(const char* what, const std::string& tmpl, const TemplateContext& ctx,
                       const std::string& content) {
  std::string path = expand_path_template(tmpl, ctx);
  std::string error;
  if (!atomic_write_file(path, content, &error))
    warn_stderr(std::string("cannot write the ") + what + " to " + path + ": " + error);
}

void write_stats(const ProcessReport& r, const TemplateContext& ctx) {
  if (r.config.stats.empty()) return;
  if (r.config.stats == "stderr") {
    write_stderr(summary_text(r));
    return;
  }
  write_report_file("stats dump", r.config.stats, ctx, stats_json(r, ctx.host));
}

void write_snapshot_file(const ProcessReport& r, const TemplateContext& ctx) {
  if (r.config.snapshot.empty()) return;
  write_report_file("snapshot", r.config.snapshot, ctx, snapshot_json(r, ctx.host));
}

void write_trace(const ProcessReport& r, const TraceRing::Contents& trace, const TemplateContext& ctx) {
  if (r.config.trace.empty()) return;
  write_report_file("trace", r.config.trace, ctx, trace_json(trace, r.pid));
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
  guarded("reports", [&] {
    TemplateContext ctx = current_template_context();  // one %d for all files of this exit
    guarded("stats dump", [&] { write_stats(report, ctx); });
    guarded("snapshot", [&] { write_snapshot_file(report, ctx); });
    guarded("trace", [&] { write_trace(report, trace, ctx); });
  });
}

void write_exit_reports(const ProcessReport& report) {
  guarded("trace", [&] {
    TraceRing::Contents trace;
    if (!report.config.trace.empty()) trace = ProcessObserver::instance().trace_contents();
    write_exit_reports(report, trace);
  });
}

void write_snapshot(const ProcessReport& report) {
  guarded("snapshot", [&] { write_snapshot_file(report, current_template_context()); });
}

}  // namespace cachalloc::obs
