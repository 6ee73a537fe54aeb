// hook_table.cpp — the two lookup tables.
#include "hook_table.h"

#include <cstring>

namespace cachalloc::shim {
namespace {

#define W(fn) reinterpret_cast<void*>(&::fn)

struct ByName {
  const char* name;
  void* wrapper;
};

const ByName kByName[] = {
    {"cuGetProcAddress", W(cuGetProcAddress)},
    {"cuGetProcAddress_v2", W(cuGetProcAddress_v2)},
    {"cuMemAlloc_v2", W(cuMemAlloc_v2)},
    {"cuMemFree_v2", W(cuMemFree_v2)},
    {"cuMemGetInfo_v2", W(cuMemGetInfo_v2)},
    {"cuMemAllocAsync", W(cuMemAllocAsync)},
    {"cuMemAllocAsync_ptsz", W(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", W(cuMemFreeAsync)},
    {"cuMemFreeAsync_ptsz", W(cuMemFreeAsync_ptsz)},
    {"cuStreamCreate", W(cuStreamCreate)},
    {"cuStreamCreateWithPriority", W(cuStreamCreateWithPriority)},
    {"cuStreamDestroy_v2", W(cuStreamDestroy_v2)},
    {"cuStreamBeginCapture_v2", W(cuStreamBeginCapture_v2)},
    {"cuStreamBeginCapture_v2_ptsz", W(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", W(cuStreamBeginCaptureToGraph)},
    {"cuStreamBeginCaptureToGraph_ptsz", W(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", W(cuStreamEndCapture)},
    {"cuStreamEndCapture_ptsz", W(cuStreamEndCapture_ptsz)},
};

// A base name as cuGetProcAddress sees it: the wrapper applies from
// `min_version` on (older versions name an ABI cachalloc does not wrap), with
// a separate wrapper for per-thread-default-stream lookups where one exists.
struct ByBase {
  const char* base;
  int min_version;
  void* wrapper;
  void* wrapper_ptsz;
};

const ByBase kByBase[] = {
    {"cuMemAlloc", 3020, W(cuMemAlloc_v2), nullptr},
    {"cuMemFree", 3020, W(cuMemFree_v2), nullptr},
    {"cuMemGetInfo", 3020, W(cuMemGetInfo_v2), nullptr},
    {"cuMemAllocAsync", 11020, W(cuMemAllocAsync), W(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, W(cuMemFreeAsync), W(cuMemFreeAsync_ptsz)},
    {"cuStreamCreate", 0, W(cuStreamCreate), nullptr},
    {"cuStreamCreateWithPriority", 0, W(cuStreamCreateWithPriority), nullptr},
    {"cuStreamDestroy", 4000, W(cuStreamDestroy_v2), nullptr},
    {"cuStreamBeginCapture", 10010, W(cuStreamBeginCapture_v2), W(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", 12030, W(cuStreamBeginCaptureToGraph), W(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", 0, W(cuStreamEndCapture), W(cuStreamEndCapture_ptsz)},
};

#undef W

}  // namespace

void* wrapper_for_symbol(const char* name) {
  for (const ByName& e : kByName)
    if (std::strcmp(e.name, name) == 0) return e.wrapper;
  return nullptr;
}

void* wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags) {
  if (std::strcmp(symbol, "cuGetProcAddress") == 0)
    return cuda_version >= 12000 ? reinterpret_cast<void*>(&::cuGetProcAddress_v2)
                                 : reinterpret_cast<void*>(&::cuGetProcAddress);
  const bool ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (const ByBase& e : kByBase) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    if (cuda_version < e.min_version) return nullptr;
    return ptsz && e.wrapper_ptsz != nullptr ? e.wrapper_ptsz : e.wrapper;
  }
  return nullptr;
}

}  // namespace cachalloc::shim
