// exit_hooks.h — process-level hooks that write cachalloc's reports.
//
// The shim calls cachalloc_install_exit_hooks() once, when CUDA is first used
// (after init_logging and ProcessObserver::configure).  From then on the
// reports (stats dump, snapshot, trace; see core/obs/reports.h) are written
// exactly once: at exit() / return from main (atexit), or on SIGTERM/SIGINT
// (then the program ends as it would have without cachalloc).  The snapshot
// is also written whenever config.snapshot_signal arrives.  A program that
// never used CUDA never calls this, so it writes nothing.
#pragma once

#include "obs/process_report.h"

// Idempotent (only the first call does anything).  Takes the effective
// configuration (which signals, which reports).  Never throws.
void cachalloc_install_exit_hooks(const cachalloc::Config& config);
// The same, reading the configuration through cachalloc_collect_report(false);
// do not call it while holding a lock that collect_report takes.
void cachalloc_install_exit_hooks();

// Writes the exit reports now unless they were already written (the same
// once-only guard as the hooks).  Returns true if this call wrote them.
bool cachalloc_write_exit_reports_once();

// Implemented by the shim: a copy of every device's state plus the interposer
// counters and the effective config.  `with_segments` fills
// DeviceReport::segments (snapshots).  Must not call the driver (it runs while
// the process is exiting, possibly in a signal handler): it only reads the
// core's state.
cachalloc::obs::ProcessReport cachalloc_collect_report(bool with_segments);
