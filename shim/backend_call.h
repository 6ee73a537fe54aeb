// backend_call.h — how the two backends over the real driver
// (cuda_backend.cpp for the device cache, cuda_host_backend.cpp for the
// pinned host cache) make a driver call: timed into the dump's
// ns_in_driver when it is made inside a timed wrapper (process_state.h),
// counted under its name, and its CUresult read as the core's Status.
// Included by those two files only (it defines CALL).
#pragma once

#include "cuda_api.h"
#include "process_state.h"
#include "types.h"

namespace cachalloc::shim {

inline Status status(CUresult r) { return static_cast<Status>(r); }

template <class Fn, class... Args>
CUresult timed_call(obs::DriverCall which, Fn fn, Args... args) {
  DriverTimer timed(which);
  return fn(args...);
}

}  // namespace cachalloc::shim

// CALL(cuEventRecord, e, s): d_->cuEventRecord(e, s), timed and counted
// under its name (d_: the backend's RealDriver).
#define CALL(name, ...) \
  ::cachalloc::shim::timed_call(::cachalloc::obs::DriverCall::name, d_->name __VA_OPT__(, ) __VA_ARGS__)
