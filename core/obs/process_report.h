// process_report.h — what the interposer hands the observability layer at
// exit (or on a signal): per-device allocator state plus the counters only an
// interposer knows.  The shim fills it; core/obs formats and writes it.
#pragma once

#include "tag_state.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "host_cache.h"
#include "observer.h"
#include "path_template.h"
#include "stats.h"

namespace cachalloc::obs {

// Entry points the shim counts, named as the driver/runtime names them.
enum class Entry : int {
  cuMemAlloc_v2,
  cuMemFree_v2,
  cuMemAllocAsync,
  cuMemFreeAsync,
  cuMemAllocAsync_ptsz,
  cuMemFreeAsync_ptsz,
  cuMemGetInfo_v2,
  cudaMalloc,
  cudaFree,
  cudaMallocAsync,
  cudaFreeAsync,
  cudaMemGetInfo,
  count
};
const char* entry_name(Entry e);

// Why a call went to the real driver instead of the cache.
enum class Passthrough : int { capture, foreign_pointer, count };
const char* passthrough_name(Passthrough p);

// The driver calls the cache itself makes (shim/cuda_backend.cpp,
// cuda_host_backend.cpp), counted by function in the dump: which ones a
// program's "driver calls per free" are (fences and their joins, segments,
// expandable segments' page maps) without a profiler.
#define CACHALLOC_DRIVER_CALLS(X)                                                                   \
  X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemGetInfo_v2) X(cuEventCreate) X(cuEventRecord)           \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuCtxSynchronize)                  \
  X(cuStreamWaitEvent) X(cuCtxRecordEvent) X(cuStreamQuery) X(cuCtxWaitEvent)                      \
  X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate)     \
  X(cuMemRelease) X(cuMemMap) X(cuMemSetAccess) X(cuMemUnmap) X(cuMemHostAlloc) X(cuMemFreeHost) \
  X(cuStreamCreate) X(cuMemcpyDtoHAsync_v2) X(cuMemcpyHtoDAsync_v2) X(cuStreamSynchronize)
enum class DriverCall : int {
#define CACHALLOC_X(name) name,
  CACHALLOC_DRIVER_CALLS(CACHALLOC_X)
#undef CACHALLOC_X
  count
};
inline const char* driver_call_name(DriverCall c) {
  static constexpr const char* kNames[] = {
#define CACHALLOC_X(name) #name,
      CACHALLOC_DRIVER_CALLS(CACHALLOC_X)
#undef CACHALLOC_X
  };
  const int i = static_cast<int>(c);
  return i >= 0 && i < static_cast<int>(DriverCall::count) ? kNames[i] : "?";
}

// Updated with relaxed atomics; read once at exit.  The per-entry call
// counts are kept per thread by the shim (shim/thread_counts.h): they are
// on every call's path.
struct InterposerCounters {
  std::array<std::atomic<std::uint64_t>, static_cast<int>(Passthrough::count)> passthrough{};
  std::atomic<std::uint64_t> ns_inside{0};  // wall time inside cachalloc's wrappers
  // Of ns_inside: the wall time of the driver calls those wrappers made for
  // the cache (segment and VM allocation and release, events, device
  // synchronization; not the per-call context lookup), and how many.  What
  // is left is cachalloc's own time.
  std::atomic<std::uint64_t> ns_in_driver{0};
  std::atomic<std::uint64_t> driver_calls{0};
  std::array<std::atomic<std::uint64_t>, static_cast<int>(DriverCall::count)> driver_calls_by{};  // of driver_calls

  void count(Passthrough p) { passthrough[static_cast<int>(p)].fetch_add(1, std::memory_order_relaxed); }
};

// One tag of a device's allocator (core/tag_state.h) under its name.
struct TagReport {
  std::string name;
  TagStats stats;
};

struct DeviceReport {
  int device = 0;                      // CUDA device ordinal
  DeviceStats stats;
  std::size_t device_total = 0;        // bytes
  std::vector<SegmentInfo> segments;   // filled for snapshots only
  bool context_destroyed = false;      // its context was destroyed or reset (stats as they were then)
  std::vector<TagReport> tags;         // tags seen (pause/resume: docs/PAUSE.md)
};

// An out-of-memory condition that repeats whatever the program does (a
// configured limit below what every such request needs): ProcessObserver
// prints its first message in full and counts the others.
struct RepeatedOom {
  int device = 0;
  const char* reason = "";       // oom_repeat_reason(): "per_process_memory_fraction", "larger_than_device"
  std::uint64_t count = 0;       // out-of-memory errors for it, the printed one included
  std::size_t allowed = 0;       // the fraction's cap, bytes
  std::size_t device_total = 0;  // bytes
  std::size_t largest_need = 0;  // the largest segment (fraction) or request (device) refused
};

struct ProcessReport {
  Config config;
  // CACHALLOC_CONF items that were not applied, one message each (issue 37).
  std::vector<std::string> config_errors;
  std::string command_line;            // argv joined by spaces
  int pid = 0;
  JobPlace job;                        // rank, world size, job id (issue 37 item 4: the job report)
  std::vector<DeviceReport> devices;
  // Copied out of InterposerCounters (plain numbers, so reports can be built in tests).
  std::array<std::uint64_t, static_cast<int>(Entry::count)> calls{};
  std::array<std::uint64_t, static_cast<int>(Passthrough::count)> passthrough{};
  std::uint64_t ns_inside = 0;
  std::uint64_t ns_in_driver = 0;      // part of ns_inside spent in driver calls
  std::uint64_t driver_calls = 0;      // the driver calls counted in ns_in_driver
  std::array<std::uint64_t, static_cast<int>(DriverCall::count)> driver_calls_by{};  // the same, by function
  std::vector<RepeatedOom> repeated_ooms;  // ProcessObserver::repeated_ooms()
  // The pinned host cache (core/host_cache.h), when the process used it.
  bool has_host = false;
  HostStats host;
};

}  // namespace cachalloc::obs
