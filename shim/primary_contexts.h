// primary_contexts.h — what the control API (control_api.cpp) and the
// pluggable ABI (pluggable_api.cpp) share, below both: the memory fraction
// set at run time, and the primary context of each device the pluggable ABI
// serves in, with the passive mode's check for primary context resets.
//
// cachalloc_set_memory_fraction (and PyTorch's
// torch.cuda.set_per_process_memory_fraction through the pluggable hook)
// caps what the pluggable ABI may keep reserved on a device, on top of
// CACHALLOC_CONF per_process_memory_fraction (which the core enforces for
// every allocation).
//
// Uses the context registry, the process state and the real driver; never
// the control API nor the pluggable ABI.
#pragma once

#include "cuda_api.h"
#include "process_state.h"

namespace cachalloc::shim {

struct RealDriver;

// Devices the run-time fraction can name (ordinals 0 .. kMaxFractionDevices-1).
inline constexpr int kMaxFractionDevices = 64;

// The fraction set for `device`, or 0 when none was set.
double memory_fraction_override(int device);
// Sets it for `device` (-1: every device).  False for an ordinal out of range.
bool set_memory_fraction_override(int device, double fraction);

// The primary context of `device` to serve in, retained once for the life
// of the process (as cudart does); nullptr when the driver refuses.
// Passive, it is first checked against the context its cache was made in:
// one cuCtxGetId per call (primary_contexts.cpp says how a reset is found
// and what it does to the cache).  Active, the hooks see resets: nothing
// more to do.  `activate`: an allocation retains a primary found inactive
// again; a free does not (nullptr then, the cache retired).
CUcontext live_primary(const RealDriver* d, int device, Mode m, bool activate);

// Whether `ptr` was a live block of a destroyed context (retired by the
// check above): its free then does nothing, as the driver's cuMemFree of
// memory that died with its context changes nothing.  Asked before the live
// caches.  Forgets `ptr` when true.
bool drop_orphan(void* ptr);

// Passive mode (dlopen'ed): checks every primary context the pluggable ABI
// uses against a reset or destruction the hooks could not see, retiring
// the cache of one found destroyed.  The control API calls it before
// touching the caches.  Nothing in other modes.
void check_primary_contexts();

}  // namespace cachalloc::shim
