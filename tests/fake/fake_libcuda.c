/* fake_libcuda.c — a libcuda.so.1 that runs on the host, for the shim's tests.
 *
 * Built as tests/fake/libcuda.so.1.  Device memory is host memory
 * (aligned_alloc, 512 B) counted against a configurable total
 * (FAKE_CUDA_TOTAL_MB, default 1024) so that out-of-memory can be provoked.
 * Streams, events and contexts are small host structs.  Completion of GPU
 * work is scripted: a stream the test holds busy (fake_cuda_hold_stream)
 * leaves every event recorded on it incomplete until released or
 * synchronized.  The legacy stream orders against every blocking stream, as
 * on a GPU: an event on it waits for held blocking streams and vice versa.
 * cuGetProcAddress(_v2) resolves base names by version and flags into the
 * fake's own functions (never through dlsym, which the shim hooks).
 * Every entry point takes one global lock: tests are small, clarity wins. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#undef cuGetProcAddress

#include "fake_libcuda.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 4
#define MAX_DEPS 32

struct CUctx_st { int device; };
struct CUstream_st {
  int held;                  /* work recorded now stays incomplete */
  unsigned epoch;            /* bumped whenever pending work completes */
  int capturing;
  int blocking;              /* orders against the legacy stream */
  struct CUstream_st* next;  /* registry of created streams */
  int dead;                  /* destroyed: the real driver may crash on it */
};
struct CUevent_st {
  int ndeps;
  struct { struct CUstream_st* s; unsigned epoch; } deps[MAX_DEPS];
};
struct CUgraph_st { int unused; };

struct allocation { void* ptr; size_t size; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_cuda_stats_t stats;
static int initialized;
static int device_count = 1;
static struct CUctx_st primary[MAX_DEVICES];
static __thread CUcontext current;
static struct CUstream_st legacy_stream = {0, 0, 0, 1, NULL};
static __thread struct CUstream_st per_thread_stream = {0, 0, 0, 1, NULL};
static struct CUstream_st* streams;  /* created streams */
static struct allocation* allocs;
static size_t nallocs, cap_allocs;
static struct CUgraph_st the_graph;

static void lock_fake(void) { pthread_mutex_lock(&lock); }
static void unlock_fake(void) { pthread_mutex_unlock(&lock); }

static size_t env_size(const char* name, size_t def) {
  const char* v = getenv(name);
  return v && *v ? (size_t)strtoull(v, NULL, 10) : def;
}

static void init_once(void) {
  static int done;
  if (done) return;
  done = 1;
  stats.total_bytes = env_size("FAKE_CUDA_TOTAL_MB", 1024) << 20;
  device_count = (int)env_size("FAKE_CUDA_DEVICES", 1);
  if (device_count < 1 || device_count > MAX_DEVICES) device_count = 1;
  for (int i = 0; i < MAX_DEVICES; ++i) primary[i].device = i;
}

/* Maps a stream handle as the driver would: 0 is the default stream of the
 * calling convention (legacy, or per-thread for _ptsz entry points). */
static struct CUstream_st* resolve_stream(CUstream s, int ptsz) {
  if (s == NULL) return ptsz ? &per_thread_stream : &legacy_stream;
  if (s == CU_STREAM_LEGACY) return &legacy_stream;
  if (s == CU_STREAM_PER_THREAD) return &per_thread_stream;
  return s;
}

/* ---------------- memory bookkeeping ---------------- */

static CUresult add_allocation(CUdeviceptr* out, size_t size) {
  if (out == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  size_t rounded = (size + 511) & ~(size_t)511;
  if (stats.live_bytes + rounded > stats.total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = aligned_alloc(512, rounded);
  if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  if (nallocs == cap_allocs) {
    cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
    allocs = realloc(allocs, cap_allocs * sizeof *allocs);
  }
  allocs[nallocs].ptr = p;
  allocs[nallocs].size = rounded;
  ++nallocs;
  stats.live_bytes += rounded;
  stats.live_allocs++;
  *out = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

/* Frees an allocation the fake handed out; anything else (an interior
 * pointer, a pointer freed twice) is CUDA_ERROR_INVALID_VALUE. */
static CUresult remove_allocation(CUdeviceptr ptr) {
  for (size_t i = 0; i < nallocs; ++i) {
    if ((CUdeviceptr)(uintptr_t)allocs[i].ptr != ptr) continue;
    free(allocs[i].ptr);
    stats.live_bytes -= allocs[i].size;
    stats.live_allocs--;
    allocs[i] = allocs[--nallocs];
    return CUDA_SUCCESS;
  }
  stats.mem_free_invalid++;
  return CUDA_ERROR_INVALID_VALUE;
}

/* ---------------- init, devices, contexts ---------------- */

EXPORT CUresult cuInit(unsigned int flags) {
  (void)flags;
  lock_fake();
  init_once();
  initialized = 1;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = device_count;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  lock_fake();
  init_once();
  *bytes = stats.total_bytes;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice d) {
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 1; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = &primary[d];
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  return d >= 0 && d < device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = current;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *d = current->device;
  return CUDA_SUCCESS;
}

static CUresult create_context(CUcontext* out, CUdevice d) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
  struct CUctx_st* c = calloc(1, sizeof *c);
  c->device = d;
  current = c;
  *out = c;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext* out, unsigned int flags, CUdevice d) {
  (void)flags;
  return create_context(out, d);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext* out, CUctxCreateParams* params, unsigned int flags, CUdevice d) {
  (void)params;
  (void)flags;
  return create_context(out, d);
}

/* Synchronizing completes all work enqueued so far: every stream's epoch
 * advances; a held stream keeps holding work recorded afterwards. */
static void complete_all_streams(void) {
  legacy_stream.epoch++;
  per_thread_stream.epoch++;
  for (struct CUstream_st* s = streams; s; s = s->next) s->epoch++;
}

EXPORT CUresult cuCtxSynchronize(void) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  lock_fake();
  stats.ctx_sync++;
  complete_all_streams();
  unlock_fake();
  return CUDA_SUCCESS;
}

/* ---------------- streams ---------------- */

static CUresult create_stream(CUstream* out, unsigned int flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  struct CUstream_st* s = calloc(1, sizeof *s);
  s->blocking = !(flags & CU_STREAM_NON_BLOCKING);
  lock_fake();
  s->next = streams;
  streams = s;
  stats.stream_create++;
  unlock_fake();
  *out = s;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream* out, unsigned int flags) { return create_stream(out, flags); }

EXPORT CUresult cuStreamCreateWithPriority(CUstream* out, unsigned int flags, int priority) {
  (void)priority;
  return create_stream(out, flags);
}

EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned int* flags) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st* st = resolve_stream(s, 0);
  *flags = st->blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  /* Unlinked but never freed: events recorded on it may still point here. */
  for (struct CUstream_st** p = &streams; *p; p = &(*p)->next)
    if (*p == s) { *p = s->next; break; }
  s->dead = 1;
  stats.stream_destroy++;
  unlock_fake();
  return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s, int ptsz) {
  lock_fake();
  stats.stream_sync++;
  struct CUstream_st* st = resolve_stream(s, ptsz);
  if (st == &legacy_stream) complete_all_streams();
  else st->epoch++;
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }

static CUresult begin_capture(CUstream s, int ptsz) {
  struct CUstream_st* st = resolve_stream(s, ptsz);
  if (st == &legacy_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  lock_fake();
  st->capturing = 1;
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) { (void)m; return begin_capture(s, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { (void)m; return begin_capture(s, 1); }

static CUresult end_capture(CUstream s, CUgraph* g, int ptsz) {
  struct CUstream_st* st = resolve_stream(s, ptsz);
  lock_fake();
  int was = st->capturing;
  st->capturing = 0;
  unlock_fake();
  if (!was) return CUDA_ERROR_ILLEGAL_STATE;
  if (g) *g = &the_graph;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* g) { return end_capture(s, g, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) { return end_capture(s, g, 1); }

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus* out, int ptsz) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  *out = resolve_stream(s, ptsz)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* out) { return is_capturing(s, out, 0); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* out) { return is_capturing(s, out, 1); }

/* ---------------- events ---------------- */

EXPORT CUresult cuEventCreate(CUevent* out, unsigned int flags) {
  (void)flags;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  lock_fake();
  stats.event_create++;
  unlock_fake();
  *out = calloc(1, sizeof(struct CUevent_st));
  return CUDA_SUCCESS;
}

static void add_dep(struct CUevent_st* e, struct CUstream_st* s) {
  if (s->held && e->ndeps < MAX_DEPS) {
    e->deps[e->ndeps].s = s;
    e->deps[e->ndeps].epoch = s->epoch;
    e->ndeps++;
  }
}

/* The event waits for the held streams its stream is ordered after. */
static CUresult event_record(CUevent e, CUstream s, int ptsz) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_record++;
  struct CUstream_st* st = resolve_stream(s, ptsz);
  if (st->dead) { /* the real driver dereferences freed memory here */
    stats.record_on_dead_stream++;
    unlock_fake();
    return CUDA_ERROR_INVALID_HANDLE;
  }
  e->ndeps = 0;
  add_dep(e, st);
  if (st == &legacy_stream) {
    add_dep(e, &per_thread_stream);
    for (struct CUstream_st* o = streams; o; o = o->next)
      if (o->blocking) add_dep(e, o);
  } else if (st->blocking) {
    add_dep(e, &legacy_stream);
  }
  unlock_fake();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

static int event_done(const struct CUevent_st* e) {
  for (int i = 0; i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) return 0;
  return 1;
}

EXPORT CUresult cuEventQuery(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_query++;
  CUresult r = event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  unlock_fake();
  return r;
}

/* Waiting for an event completes the work it depends on. */
EXPORT CUresult cuEventSynchronize(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_sync++;
  for (int i = 0; i < e->ndeps; ++i)
    if (e->deps[i].s->epoch == e->deps[i].epoch) e->deps[i].s->epoch++;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  lock_fake();
  stats.event_destroy++;
  unlock_fake();
  free(e);
  return CUDA_SUCCESS;
}

/* ---------------- memory ---------------- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t size) {
  lock_fake();
  init_once();
  CUresult r = add_allocation(out, size);
  if (r == CUDA_SUCCESS) stats.mem_alloc++;
  else stats.mem_alloc_failed++;
  unlock_fake();
  return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  if (ptr == 0) return CUDA_SUCCESS;
  lock_fake();
  CUresult r = remove_allocation(ptr);
  if (r == CUDA_SUCCESS) stats.mem_free++;
  unlock_fake();
  return r;
}

static CUresult alloc_async(CUdeviceptr* out, size_t size, CUstream s, int ptsz) {
  (void)s;
  lock_fake();
  init_once();
  CUresult r = add_allocation(out, size);
  if (r == CUDA_SUCCESS) {
    stats.mem_alloc_async++;
    if (ptsz) stats.mem_alloc_async_ptsz++;
  } else {
    stats.mem_alloc_failed++;
  }
  unlock_fake();
  return r;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr* out, size_t size, CUstream s) { return alloc_async(out, size, s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* out, size_t size, CUstream s) { return alloc_async(out, size, s, 1); }

static CUresult free_async(CUdeviceptr ptr, CUstream s, int ptsz) {
  (void)s;
  if (ptr == 0) return CUDA_SUCCESS;
  lock_fake();
  CUresult r = remove_allocation(ptr);
  if (r == CUDA_SUCCESS) {
    stats.mem_free_async++;
    if (ptsz) stats.mem_free_async_ptsz++;
  }
  unlock_fake();
  return r;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) { return free_async(ptr, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) { return free_async(ptr, s, 1); }

EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  lock_fake();
  init_once();
  stats.mem_get_info++;
  if (free_bytes) *free_bytes = stats.total_bytes - stats.live_bytes;
  if (total_bytes) *total_bytes = stats.total_bytes;
  unlock_fake();
  return CUDA_SUCCESS;
}


/* ---------------- virtual memory (expandable segments) ----------------
 * Reservations are PROT_NONE anonymous mappings; a physical allocation is a
 * memfd of its size; mapping puts the memfd at the reserved address, so
 * copies and memsets through the mapped range really reach memory.  The
 * created bytes count against the device total like cuMemAlloc's.
 * FAKE_CUDA_NO_POSIX_FD=1 makes cuMemCreate refuse shareable POSIX fd
 * handles (CUDA_ERROR_NOT_SUPPORTED), as drivers without them do. */

#define VM_GRANULARITY ((size_t)2 << 20)

EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                              CUmemAllocationGranularity_flags option) {
  (void)prop;
  (void)option;
  if (g == NULL) return CUDA_ERROR_INVALID_VALUE;
  *g = VM_GRANULARITY;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
  (void)align;
  (void)addr;
  (void)flags;
  if (ptr == NULL || size == 0 || size % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  /* Over-reserve by one granule so the range can start granule-aligned. */
  void* p = mmap(NULL, size + VM_GRANULARITY, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t a = ((uintptr_t)p + VM_GRANULARITY - 1) & ~(uintptr_t)(VM_GRANULARITY - 1);
  lock_fake();
  stats.vm_reserve++;
  unlock_fake();
  *ptr = (CUdeviceptr)a;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  /* The granule of slack before or after stays mapped PROT_NONE: harmless. */
  if (munmap((void*)(uintptr_t)ptr, size) != 0) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  stats.vm_release_range++;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                            unsigned long long flags) {
  (void)flags;
  if (handle == NULL || prop == NULL || size == 0 || size % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  init_once();
  if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) &&
      env_size("FAKE_CUDA_NO_POSIX_FD", 0)) {
    stats.vm_create_refused++;
    unlock_fake();
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (stats.live_bytes + size > stats.total_bytes) {
    stats.mem_alloc_failed++;
    unlock_fake();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  stats.live_bytes += size;
  stats.vm_create++;
  unlock_fake();
  int fd = memfd_create("fake-cuda-vm", 0);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  /* The handle carries the fd and the size (sizes are multiples of 2 MiB). */
  *handle = ((CUmemGenericAllocationHandle)size) | (CUmemGenericAllocationHandle)fd;
  return CUDA_SUCCESS;
}

static int handle_fd(CUmemGenericAllocationHandle h) { return (int)(h & (VM_GRANULARITY - 1)); }
static size_t handle_size(CUmemGenericAllocationHandle h) { return (size_t)(h & ~(CUmemGenericAllocationHandle)(VM_GRANULARITY - 1)); }

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  if (close(handle_fd(h)) != 0) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  stats.live_bytes -= handle_size(h);
  stats.vm_release++;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
  (void)flags;
  if (size != handle_size(h) || offset != 0 || ptr % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, handle_fd(h), 0);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  stats.vm_map++;
  unlock_fake();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (desc == NULL || count == 0) return CUDA_ERROR_INVALID_VALUE;
  return mprotect((void*)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  /* Back to reserved-but-inaccessible address space. */
  void* p = mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  stats.vm_unmap++;
  unlock_fake();
  return CUDA_SUCCESS;
}

/* Copies and memset run at once on the host: the fake has no real queue. */
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  memcpy((void*)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  (void)s;
  return cuMemcpyHtoD_v2(dst, src, n);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return cuMemcpyDtoH_v2(dst, src, n);
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  memset((void*)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}

/* ---------------- errors ---------------- */

static const struct { CUresult code; const char* name; const char* text; } error_table[] = {
  {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
  {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
  {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
  {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

static int find_error(CUresult e) {
  for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; ++i)
    if (error_table[i].code == e) return (int)i;
  return -1;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char** out) {
  int i = find_error(e);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *out = error_table[i].name;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult e, const char** out) {
  int i = find_error(e);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *out = error_table[i].text;
  return CUDA_SUCCESS;
}

/* ---------------- cuGetProcAddress ---------------- */

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status);
EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags);

/* Base name -> implementation, first match wins: an entry applies from
 * `min_version` on, and ptsz entries only to per-thread lookups. */
struct proc_entry { const char* base; int min_version; int ptsz; const char* name; void* fn; };
#define PROC(base, ver, ptsz, fn) {base, ver, ptsz, #fn, (void*)fn}
static const struct proc_entry proc_table[] = {
  PROC("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
  PROC("cuGetProcAddress", 11030, 0, cuGetProcAddress),
  PROC("cuInit", 2000, 0, cuInit),
  PROC("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
  PROC("cuDeviceGet", 2000, 0, cuDeviceGet),
  PROC("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
  PROC("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
  PROC("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute),
  PROC("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
  PROC("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
  PROC("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
  PROC("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
  PROC("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
  PROC("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
  PROC("cuCtxCreate", 12050, 0, cuCtxCreate_v4),
  PROC("cuCtxCreate", 3020, 0, cuCtxCreate_v2),
  PROC("cuStreamCreate", 2000, 0, cuStreamCreate),
  PROC("cuStreamCreateWithPriority", 5050, 0, cuStreamCreateWithPriority),
  PROC("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
  PROC("cuStreamSynchronize", 7000, 1, cuStreamSynchronize_ptsz),
  PROC("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
  PROC("cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz),
  PROC("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2),
  PROC("cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz),
  PROC("cuStreamEndCapture", 10000, 0, cuStreamEndCapture),
  PROC("cuStreamIsCapturing", 10000, 1, cuStreamIsCapturing_ptsz),
  PROC("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
  PROC("cuEventCreate", 2000, 0, cuEventCreate),
  PROC("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
  PROC("cuEventRecord", 2000, 0, cuEventRecord),
  PROC("cuEventQuery", 2000, 0, cuEventQuery),
  PROC("cuEventSynchronize", 2000, 0, cuEventSynchronize),
  PROC("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
  PROC("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
  PROC("cuMemFree", 3020, 0, cuMemFree_v2),
  PROC("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
  PROC("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
  PROC("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
  PROC("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
  PROC("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
  PROC("cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2),
  PROC("cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2),
  PROC("cuMemcpyHtoDAsync", 3020, 0, cuMemcpyHtoDAsync_v2),
  PROC("cuMemcpyDtoHAsync", 3020, 0, cuMemcpyDtoHAsync_v2),
  PROC("cuMemsetD8", 3020, 0, cuMemsetD8_v2),
  PROC("cuGetErrorName", 6000, 0, cuGetErrorName),
  PROC("cuGetErrorString", 6000, 0, cuGetErrorString),
};
#undef PROC
#define PROC_COUNT (sizeof proc_table / sizeof proc_table[0])

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  lock_fake();
  stats.get_proc_address++;
  unlock_fake();
  int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  int known = 0;
  *pfn = NULL;
  for (size_t i = 0; i < PROC_COUNT; ++i) {
    if (strcmp(proc_table[i].base, symbol) != 0) continue;
    known = 1;
    if (version < proc_table[i].min_version || (proc_table[i].ptsz && !ptsz)) continue;
    *pfn = proc_table[i].fn;
    break;
  }
  if (status)
    *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                   : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* ---------------- test controls ---------------- */

EXPORT void fake_cuda_stats(struct fake_cuda_stats_t* out) {
  lock_fake();
  init_once();
  *out = stats;
  unlock_fake();
}

EXPORT void fake_cuda_hold_stream(CUstream s, int on) {
  lock_fake();
  struct CUstream_st* st = resolve_stream(s, 0);
  if (on) {
    st->held = 1;
  } else if (st->held) {
    st->held = 0;
    st->epoch++;
  }
  unlock_fake();
}

EXPORT void* fake_cuda_lookup_raw(const char* name) {
  for (size_t i = 0; i < PROC_COUNT; ++i)
    if (strcmp(proc_table[i].name, name) == 0) return proc_table[i].fn;
  return NULL;
}
