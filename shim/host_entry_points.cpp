// host_entry_points.cpp — the exported pinned host memory symbols.
//
// As entry_points.cpp: a program linked against libcuda calls these
// directly, and the dlsym and cuGetProcAddress hooks hand out the same
// functions (hook_table.cpp).  No exception crosses into C.
#include "guarded.h"
#include "host_ops.h"

using namespace cachalloc::shim;

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return guarded([&] { return do_mem_host_alloc(pp, bytesize, Flags); });
}

EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return guarded([&] { return do_mem_alloc_host(pp, bytesize); });
}

EXPORT CUresult cuMemFreeHost(void* p) {
  return guarded([&] { return do_mem_free_host(p); });
}

EXPORT CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  return guarded([&] { return do_mem_host_get_flags(pFlags, p); });
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  return guarded([&] { return do_mem_host_get_device_pointer(pdptr, p, Flags); });
}
