// exit_hooks.h — process-level hooks that write cachalloc's reports.
//
// The shim calls cachalloc_install_exit_hooks() once, when CUDA is first used
// (after init_logging and ProcessObserver::configure), passing the source
// the reports read the process state from.  From then on the
// reports (stats dump, snapshot, trace; see core/obs/reports.h) are written
// exactly once: at exit() / return from main (atexit), or on SIGTERM/SIGINT
// (then the program ends as it would have without cachalloc).  The snapshot
// is also written whenever config.snapshot_signal arrives.  A program that
// never used CUDA never calls this, so it writes nothing.
#pragma once

#include "obs/process_report.h"

// Where the reports come from: a copy of every device's state plus the
// interposer counters and the effective config; `with_segments` fills
// DeviceReport::segments (snapshots).  It must not call the driver (it runs
// while the process is exiting, possibly in a signal handler): it only
// reads the core's state.  The layer above passes its own at start-up
// (report_source.cpp's cachalloc_collect_report), so this file, the lowest
// of the shim, calls nothing above it.
namespace cachalloc {
using ReportSource = obs::ProcessReport (*)(bool with_segments);
}  // namespace cachalloc

// Idempotent (only the first call does anything).  Takes the effective
// configuration (which signals, which reports) and the source the reports
// are collected from (not null).  Never throws.
void cachalloc_install_exit_hooks(const cachalloc::Config& config, cachalloc::ReportSource source);

// Writes the exit reports now unless they were already written (the same
// once-only guard as the hooks).  Returns true if this call wrote them;
// false too before the hooks were installed (no source to collect from).
bool cachalloc_write_exit_reports_once();
