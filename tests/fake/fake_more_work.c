/* fake_more_work.c — entry points that put work on a stream without being
 * a kernel launch, and two that no cuda.h declares.
 *
 * They let the integration tests reach the shim through calls it once did
 * not watch (copies to and from arrays, batched copies in the CUDA 12.8 and
 * 13.0 ABIs, stream memory operations, decompression, the old grid launch)
 * and through entry points newer than its headers: "cuFutureWork" (a
 * per-thread variant, cuFutureWork_ptsz, and a plain one) and a second ABI
 * of cuLaunchKernel at version 13050 (cuLaunchKernel_v13050).  Each is work
 * on its stream, as fake_launch counts it. */
#include "fake_state.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuLaunchGridAsync */

EXPORT CUresult cuMemcpyAtoD_v2_ptds(CUdeviceptr dst, CUarray src, size_t off, size_t n) {
  (void)dst, (void)src, (void)off, (void)n;
  return fake_launch(NULL, 1);
}
EXPORT CUresult cuMemcpyDtoA_v2_ptds(CUarray dst, size_t off, CUdeviceptr src, size_t n) {
  (void)dst, (void)off, (void)src, (void)n;
  return fake_launch(NULL, 1);
}
/* The CUDA 12.8 ABI (a failIdx before the stream), exported under the old name. */
EXPORT CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                        CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t nattrs, size_t* fail_idx,
                                        CUstream s) {
  (void)dsts, (void)srcs, (void)sizes, (void)count, (void)attrs, (void)attr_idxs, (void)nattrs;
  if (fail_idx != NULL) *fail_idx = (size_t)-1;
  return fake_launch(s, 1);
}
EXPORT CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                           CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t nattrs, CUstream s) {
  (void)dsts, (void)srcs, (void)sizes, (void)count, (void)attrs, (void)attr_idxs, (void)nattrs;
  return fake_launch(s, 1);
}
EXPORT CUresult cuStreamWaitValue32_v2_ptsz(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  (void)addr, (void)value, (void)flags;
  return fake_launch(s, 1);
}
EXPORT CUresult cuMemBatchDecompressAsync_ptsz(CUmemDecompressParams* params, size_t count, unsigned int flags,
                                               size_t* error_index, CUstream s) {
  (void)params, (void)count, (void)flags, (void)error_index;
  return fake_launch(s, 1);
}
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
  (void)f, (void)w, (void)h;
  return fake_launch(s, 0);
}
/* Newer than any header: six arguments, the stream last. */
EXPORT CUresult cuFutureWork_ptsz(void* a, int b, size_t c, void* d, unsigned e, CUstream s) {
  (void)a, (void)b, (void)c, (void)d, (void)e;
  return fake_launch(s, 1);
}
EXPORT CUresult cuFutureWork(void* a, int b, size_t c, void* d, unsigned e, CUstream s) {
  (void)a, (void)b, (void)c, (void)d, (void)e;
  return fake_launch(s, 0);
}
/* A module load: nothing behind the handle (the fake runs no kernels). */
static int fake_module;
EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
  *module = (CUmodule)&fake_module;
  return CUDA_SUCCESS;
}
/* cuLaunchKernel's signature with an extra argument on the stack: a new ABI
 * a lookup at version 13050 gets. */
EXPORT CUresult cuLaunchKernel_v13050(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                      unsigned bz, unsigned shmem, CUstream s, void** params, void** extra,
                                      unsigned long long tag) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
  if (tag != 0x5ca1ab1eULL) return CUDA_ERROR_INVALID_VALUE; /* the stack argument arrived intact */
  return fake_launch(s, 0);
}
