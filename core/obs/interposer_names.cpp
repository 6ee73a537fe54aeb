// interposer_names.cpp — names of the interposer's counters (process_report.h),
// as the driver and runtime spell them; they are JSON keys in the dump.
#include "process_report.h"

namespace cachalloc::obs {

const char* entry_name(Entry e) {
  switch (e) {
    case Entry::cuMemAlloc_v2: return "cuMemAlloc_v2";
    case Entry::cuMemFree_v2: return "cuMemFree_v2";
    case Entry::cuMemAllocAsync: return "cuMemAllocAsync";
    case Entry::cuMemFreeAsync: return "cuMemFreeAsync";
    case Entry::cuMemAllocAsync_ptsz: return "cuMemAllocAsync_ptsz";
    case Entry::cuMemFreeAsync_ptsz: return "cuMemFreeAsync_ptsz";
    case Entry::cuMemGetInfo_v2: return "cuMemGetInfo_v2";
    case Entry::cudaMalloc: return "cudaMalloc";
    case Entry::cudaFree: return "cudaFree";
    case Entry::cudaMallocAsync: return "cudaMallocAsync";
    case Entry::cudaFreeAsync: return "cudaFreeAsync";
    case Entry::cudaMemGetInfo: return "cudaMemGetInfo";
    case Entry::count: break;
  }
  return "?";
}

const char* passthrough_name(Passthrough p) {
  switch (p) {
    case Passthrough::capture: return "capture";
    case Passthrough::foreign_pointer: return "foreign_pointer";
    case Passthrough::count: break;
  }
  return "?";
}

}  // namespace cachalloc::obs
