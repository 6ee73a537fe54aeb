// shim_observability.h — connecting the interposer to core/obs.
//
// When CUDA is first used (process_state.cpp) the shim starts logging,
// configures the process observer and installs the exit hooks; every
// allocator gets the process observer (context_registry.cpp).  The exit
// hooks read the process state back through cachalloc_collect_report()
// (exit_hooks.h), implemented in report_source.cpp.
#pragma once

#include "config.h"

namespace cachalloc::shim {

void start_observability(const Config& config);

}  // namespace cachalloc::shim
