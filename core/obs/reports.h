// reports.h — writing what cachalloc observed: the stats dump, the segment
// snapshot and the Chrome trace (issue 4, items 1-3).
//
// Entry points for the shim / exit hooks are write_exit_reports() and
// write_snapshot().  Both never throw and never crash on a bad path: a file
// that cannot be written costs one warning on stderr.  Neither calls CUDA.
// The pieces they are made of (table, JSON, path templates, atomic write)
// live in their own headers: summary_table.h, dump_json.h, path_template.h,
// atomic_file.h, trace_json.h.
#pragma once

#include "process_report.h"
#include "trace_ring.h"

namespace cachalloc::obs {

// Everything config asks for at exit:
//   config.stats    == "stderr" -> summary table on stderr;
//                      otherwise  -> JSON dump to the expanded path template;
//   config.snapshot != ""       -> segment snapshot JSON (report.devices[i].segments);
//   config.trace    != ""       -> Chrome trace JSON from ProcessObserver::instance().
void write_exit_reports(const ProcessReport& report);

// The same, but with the trace taken from `trace` instead of the observer
// singleton (tests).
void write_exit_reports(const ProcessReport& report, const TraceRing::Contents& trace);

// Only the snapshot (the snapshot_signal handler).  Does nothing if
// config.snapshot is empty.
void write_snapshot(const ProcessReport& report);

}  // namespace cachalloc::obs
