/* fake_libcuda.h — the test-only controls of the fake libcuda.so.1.
 *
 * The fake driver (fake_libcuda.c) serves device memory from host memory so
 * that the shim's integration tests run without a GPU.  Besides the driver
 * API it exports a few functions whose names do not start with "cu", so the
 * shim's dlsym hook never touches them: counters of the calls that reached
 * the driver, a switch that keeps a stream "busy" (work recorded on it stays
 * incomplete until released), a lookup of the fake's own functions that
 * bypasses every hook (to make foreign pointers and to compare pointers), and
 * views of state the driver API does not show (VM access per device, open
 * IPC imports). */
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
  /* Calls naming an event, stream or memory of a destroyed context (event
   * record/query/sync/destroy, stream destroy/sync, cuMemUnmap,
   * cuMemSetAccess, cuCtxDestroy twice): a real driver may crash there. */
  unsigned long dead_context_calls;
  unsigned long ctx_destroyed;      /* contexts destroyed: cuCtxDestroy, primary release to 0, reset */
  unsigned long ipc_get;            /* cuIpcGetMemHandle calls that succeeded */
  unsigned long ipc_open;           /* cuIpcOpenMemHandle calls that succeeded (a repeated open counts) */
  unsigned long ipc_close;          /* cuIpcCloseMemHandle calls that succeeded */
  unsigned long ipc_open_refused;   /* cuIpcOpenMemHandle calls that failed, whatever the error */
  unsigned long peer_enable;        /* cuCtxEnablePeerAccess calls that succeeded */
  unsigned long peer_disable;       /* cuCtxDisablePeerAccess calls that succeeded */
  unsigned long set_access_peer;    /* cuMemSetAccess descriptors naming a device other than the memory's own */
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
/* The access flags `device` has at `ptr` in VM-mapped memory, as
 * cuMemSetAccess left them: 0 none, 1 read, 3 read/write; -1 when `ptr` is
 * not VM-mapped (never mapped, unmapped, or its context destroyed). */
int fake_cuda_vm_access(CUdeviceptr ptr, int device);
/* Mappings currently open through cuIpcOpenMemHandle in this process (one
 * per distinct handle, however many times it was opened). */
size_t fake_cuda_live_imports(void);

#ifdef __cplusplus
}
#endif
#endif
