/* fake_libcuda.h — the test-only controls of the fake libcuda.so.1.
 *
 * The fake driver (tests/fake/fake_*.c; fake_state.h lists the files) serves
 * device memory from host memory so that the shim's integration tests run
 * without a GPU.  Besides the driver API it exports a few functions whose
 * names do not start with "cu", so the shim's dlsym hook never touches them:
 * counters of the calls that reached the driver and of what it still holds,
 * a switch that keeps a stream "busy" (work recorded on it stays incomplete
 * until released), a lookup of the fake's own functions that bypasses every
 * hook (to make foreign pointers and to compare pointers), views of state
 * the driver API does not show (VM access per device, open IPC imports),
 * and fault injection (chosen or random calls of chosen entry points fail). */
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
  unsigned long set_access;         /* cuMemSetAccess calls that succeeded */
  /* What the fake still holds (with live_allocs, live_bytes and
   * fake_cuda_live_imports: nothing else outlives its release call).
   * Events and streams of a destroyed context are not counted: the driver
   * freed them with it. */
  unsigned long live_events;        /* cuEventCreate'd, not destroyed */
  unsigned long live_streams;       /* cuStreamCreate'd, not destroyed */
  unsigned long live_vm_handles;    /* cuMemCreate'd, not cuMemRelease'd */
  unsigned long live_reservations;  /* cuMemAddressReserve'd, not freed */
  unsigned long live_mappings;      /* cuMemMap'ed, not unmapped */
  unsigned long failures_injected;  /* calls failed by fake_cuda_fail / FAKE_CUDA_FAIL_RANDOM */
  unsigned long stream_query;       /* cuStreamQuery(+_ptsz) calls answered */
  unsigned long stream_wait_event;  /* cuStreamWaitEvent(+_ptsz) calls */
  unsigned long launches;           /* cuLaunchKernel(+_ptsz) calls that succeeded */
  unsigned long per_thread_launches; /* of those, on a thread's per-thread default stream */
  unsigned long capture_invalidations; /* global-mode captures broken by a record on the legacy stream */
  unsigned long ctx_record_event;   /* cuCtxRecordEvent calls that recorded (also in event_record) */
  unsigned long ctx_wait_event;     /* cuCtxWaitEvent calls that succeeded */
  /* Page-locked host memory (fake_host.c). */
  unsigned long host_alloc;         /* cuMemHostAlloc / cuMemAllocHost_v2 calls that succeeded */
  unsigned long host_alloc_failed;  /* of those calls, refused (no context, injected, out of memory) */
  unsigned long host_free;          /* cuMemFreeHost calls that freed something */
  unsigned long host_free_invalid;  /* cuMemFreeHost of anything else (CUDA_ERROR_INVALID_VALUE) */
  unsigned long host_free_syncs;    /* device waits made by cuMemFreeHost */
  unsigned long host_get_flags;     /* cuMemHostGetFlags calls */
  unsigned long host_get_device_pointer; /* cuMemHostGetDevicePointer_v2 calls */
  unsigned long live_host_allocs;   /* cuMemHostAlloc'ed, not freed */
  unsigned long host_register, host_unregister;
  unsigned long host_dropped_with_context; /* pinned allocations freed by their context's destruction */
  unsigned long ctx_set_current;    /* cuCtxSetCurrent calls */
  /* cuMemUnmap calls made while a kernel launched on a held stream had not
   * been completed by a synchronization: on a GPU, a kernel still using
   * those pages would fault (cuMemUnmap does not wait as cuMemFree does). */
  unsigned long vm_unmap_in_flight;
  /* Graphs (fake_graphs.c) and the calls a capture forbids. */
  unsigned long capture_refusals;   /* cuMemAlloc_v2/cuMemFree_v2 refused as unsafe during a capture */
  unsigned long live_graphs;        /* made by end-capture, clone; not destroyed */
  unsigned long live_execs;         /* instantiated, not destroyed */
};

/* Copies the counters. */
void fake_cuda_stats(struct fake_cuda_stats_t* out);
/* on != 0: work recorded on `stream` from now on stays incomplete until the
 * hold is released (on == 0) or something synchronizes it.  NULL or
 * CU_STREAM_LEGACY name the legacy stream. */
void fake_cuda_hold_stream(CUstream stream, int on);
/* Calls fn(arg) inside every later cuStreamBeginCapture, once the capture
 * is active (NULL: no more): lets a test act while another thread is still
 * in the begin. */
void fake_cuda_on_begin_capture(void (*fn)(void*), void* arg);
/* Calls fn(arg) at the start of every later cuMemAlloc_v2, outside the
 * fake's lock (NULL: no more): a caching allocator grows its pool there
 * with its own lock held, so a test can act while another thread holds it
 * (tc_fork_exit forks then). */
void fake_cuda_on_mem_alloc(void (*fn)(void*), void* arg);
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

/* Fault injection.  Entry points that can be made to fail: cuMemAlloc_v2,
 * cuMemAllocAsync, cuEventCreate, cuEventRecord, cuEventQuery,
 * cuEventSynchronize, cuCtxSynchronize, cuStreamCreate, cuStreamQuery,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemAddressReserve, cuMemHostAlloc
 * (with cuMemAllocHost_v2) (a _ptsz
 * variant, and cuStreamCreateWithPriority, count as their base name).  A
 * failed call changes nothing in the fake (not even its call counter) and
 * counts in failures_injected.  Calls refused for a null pointer before the
 * fake looks at its state are not counted.  An unknown name aborts. */

/* From now on the after+1-th call of `call` and the count-1 following fail
 * with `error` (count < 0: every call until reset; 0: none).  CUDA_SUCCESS
 * as `error` picks the entry point's own (out of memory for allocations,
 * CUDA_ERROR_UNKNOWN for records, queries and synchronizations). */
void fake_cuda_fail(const char* call, int after, int count, CUresult error);
/* Random mode, also armed by FAKE_CUDA_FAIL_RANDOM in the environment (read
 * at the first call that can fail): "<seed>:<per-mille>:<call,call,...>[:<error>]"
 * makes each call of a listed entry point fail with that probability, with
 * `error` (a CUresult number) or each entry point's own.  Whether the n-th
 * call of an entry point fails depends only on the seed, the entry point
 * and n.  NULL or "" disarms it; -1 (nothing changed) when malformed. */
int fake_cuda_fail_random(const char* spec);
/* Stops every injected failure (chosen and random). */
void fake_cuda_fail_reset(void);
/* How many calls so far failed with `error` by injection. */
unsigned long fake_cuda_injected(CUresult error);

#ifdef __cplusplus
}
#endif
#endif
