// proc_address_hook.cpp — cachalloc's cuGetProcAddress and cuGetProcAddress_v2.
//
// Static and shared cudart (and so PyTorch, CuPy) fetch every driver
// function through cuGetProcAddress, after first asking it for
// "cuGetProcAddress" itself.  The hook asks the real driver first and only
// redirects a symbol the driver has at the requested version and flags, so
// a caller sees exactly the driver's answers for status and errors.
#include "cuda_api.h"
#include "hook_table.h"
#include "link_imports.h"
#include "real_driver.h"
#include "stream_watch.h"

using namespace cachalloc::shim;

#define EXPORT extern "C" __attribute__((visibility("default")))

static void redirect(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr) return;
  check_link_imports();  // a lookup often follows a load (link_imports.h)
  if (void* w = wrapper_for_proc(symbol, version, flags)) *pfn = w;
  else if (void* v = watch_wrapper_for_proc(symbol, version, flags, *pfn)) *pfn = v;
}

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* symbolStatus) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->get_proc_address_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->get_proc_address_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS) redirect(symbol, pfn, cudaVersion, flags);
  return r;
}

EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  const RealDriver* d = real_driver();
  if (d == nullptr || d->get_proc_address_v1 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = d->get_proc_address_v1(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS) redirect(symbol, pfn, cudaVersion, flags);
  return r;
}
