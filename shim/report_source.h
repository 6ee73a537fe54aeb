// report_source.h — connecting the interposer to core/obs (report_source.cpp).
//
// When CUDA is first used (process_state.cpp) the shim starts logging,
// configures the process observer and installs the exit hooks; every
// allocator gets the process observer (context_registry.cpp).  The exit
// hooks read the process state back through cachalloc_collect_report(),
// which start_observability hands them (exit_hooks.h: ReportSource); the
// control API reads it the same way.  Both are implemented in
// report_source.cpp.
#pragma once

#include "config.h"
#include "obs/process_report.h"

// A copy of every device's state plus the interposer counters and the
// effective config.  `with_segments` fills DeviceReport::segments
// (snapshots).  Never calls the driver (it runs while the process is
// exiting, possibly in a signal handler): it only reads the core's state.
cachalloc::obs::ProcessReport cachalloc_collect_report(bool with_segments);

namespace cachalloc {
class HostCache;
}

namespace cachalloc::shim {

void start_observability(const Config& config);

// The pinned host cache, for the reports: host_ops.cpp says so when it
// creates it (this file, below the host hooks, includes nothing of theirs).
void note_host_cache(HostCache* cache);

}  // namespace cachalloc::shim
