/* fake_libcuda.h — the test-only controls of the fake libcuda.so.1.
 *
 * The fake driver (fake_libcuda.c) serves device memory from host memory so
 * that the shim's integration tests run without a GPU.  Besides the driver
 * API it exports a few functions whose names do not start with "cu", so the
 * shim's dlsym hook never touches them: counters of the calls that reached
 * the driver, a switch that keeps a stream "busy" (work recorded on it stays
 * incomplete until released), and a lookup of the fake's own functions that
 * bypasses every hook (to make foreign pointers and to compare pointers). */
#ifndef CACHALLOC_FAKE_LIBCUDA_H
#define CACHALLOC_FAKE_LIBCUDA_H

#include <stddef.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fake_cuda_stats_t {
  unsigned long mem_alloc;          /* cuMemAlloc_v2 calls that succeeded */
  unsigned long mem_alloc_failed;   /* cuMemAlloc_v2 / async calls refused (OOM, bad size, no context) */
  unsigned long mem_free;           /* cuMemFree_v2 calls that freed something */
  unsigned long mem_free_invalid;   /* frees of pointers the fake never handed out */
  unsigned long mem_alloc_async;    /* cuMemAllocAsync(+_ptsz) calls that succeeded */
  unsigned long mem_alloc_async_ptsz;
  unsigned long mem_free_async;     /* cuMemFreeAsync(+_ptsz) calls that freed something */
  unsigned long mem_free_async_ptsz;
  unsigned long mem_get_info;
  unsigned long event_create, event_record, event_query, event_sync, event_destroy;
  unsigned long ctx_sync, stream_sync, stream_create, stream_destroy;
  unsigned long get_proc_address;
  unsigned long live_allocs;
  size_t live_bytes;
  size_t total_bytes;
  unsigned long record_on_dead_stream; /* events recorded on a destroyed stream (a crash on a real GPU) */
  unsigned long vm_reserve, vm_release_range, vm_create, vm_create_refused, vm_release, vm_map, vm_unmap;
};

/* Copies the counters. */
void fake_cuda_stats(struct fake_cuda_stats_t* out);
/* on != 0: work recorded on `stream` from now on stays incomplete until the
 * hold is released (on == 0) or something synchronizes it.  NULL or
 * CU_STREAM_LEGACY name the legacy stream. */
void fake_cuda_hold_stream(CUstream stream, int on);
/* The fake's own implementation of a versioned driver symbol
 * ("cuMemAlloc_v2", "cuMemAllocAsync_ptsz", ...), or NULL. */
void* fake_cuda_lookup_raw(const char* name);

#ifdef __cplusplus
}
#endif
#endif
