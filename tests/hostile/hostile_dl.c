/* hostile_dl.c — a library that allocates device memory and is then
 * unloaded (dlclose) while some of its memory is still allocated, for
 * hostile.c's dlclose_library and static_destructors cases.  It is linked
 * against libcuda like any CUDA library, so under the preloaded shim its
 * calls reach cachalloc's exported entry points. */
#include <cuda.h>
#include <stddef.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static CUdeviceptr g_kept_for_exit;

/* Allocates `n` blocks of 64 KiB + i * 512 bytes, writes byte (0x40 + i)
 * into block i, frees the even ones and returns the odd ones in out[i] (0
 * for the freed).  One more block comes from cuMemAllocAsync on a stream the
 * library creates and never destroys (a careless library), in *async_out.
 * Returns 0 on success. */
EXPORT int hostile_dl_alloc(CUdeviceptr* out, int n, CUdeviceptr* async_out) {
  for (int i = 0; i < n; ++i) {
    size_t size = 64 * 1024 + (size_t)i * 512;
    if (cuMemAlloc_v2(&out[i], size) != CUDA_SUCCESS) return 1;
    if (cuMemsetD8_v2(out[i], (unsigned char)(0x40 + i), size) != CUDA_SUCCESS) return 2;
  }
  for (int i = 0; i < n; i += 2) {
    if (cuMemFree_v2(out[i]) != CUDA_SUCCESS) return 3;
    out[i] = 0;
  }
  CUstream s;
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 4;
  if (cuMemAllocAsync(async_out, 4096, s) != CUDA_SUCCESS) return 5;
  if (cuMemsetD8_v2(*async_out, 0x7a, 4096) != CUDA_SUCCESS) return 6;
  return 0;
}

/* Keeps `p` and frees it from the library's destructor at process exit
 * (after exit() began: cachalloc must answer without the driver). */
EXPORT void hostile_dl_free_at_exit(CUdeviceptr p) { g_kept_for_exit = p; }

__attribute__((destructor)) static void hostile_dl_fini(void) {
  if (g_kept_for_exit == 0) return;
  const char* msg = cuMemFree_v2(g_kept_for_exit) == CUDA_SUCCESS ? "library destructor: ok\n"
                                                                   : "library destructor: free FAILED\n";
  size_t n = 0;
  while (msg[n] != '\0') ++n;
  ssize_t ignored = write(2, msg, n);
  (void)ignored;
}
