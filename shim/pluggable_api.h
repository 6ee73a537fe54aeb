// pluggable_api.h — what the control API shares with the pluggable ABI
// (shim/pluggable_api.cpp): the memory fraction set at run time, and the
// passive mode's check for primary context resets.
//
// cachalloc_set_memory_fraction (and PyTorch's
// torch.cuda.set_per_process_memory_fraction through the pluggable hook)
// caps what the pluggable ABI may keep reserved on a device, on top of
// CACHALLOC_CONF per_process_memory_fraction (which the core enforces for
// every allocation).
#pragma once

namespace cachalloc::shim {

// Devices the run-time fraction can name (ordinals 0 .. kMaxFractionDevices-1).
inline constexpr int kMaxFractionDevices = 64;

// The fraction set for `device`, or 0 when none was set.
double memory_fraction_override(int device);
// Sets it for `device` (-1: every device).  False for an ordinal out of range.
bool set_memory_fraction_override(int device, double fraction);

// Passive mode (dlopen'ed): checks every primary context the pluggable ABI
// uses against a reset or destruction the hooks could not see, retiring
// the cache of one found destroyed (pluggable_api.cpp).  The control API
// calls it before touching the caches.  Nothing in other modes.
void check_primary_contexts();

}  // namespace cachalloc::shim
