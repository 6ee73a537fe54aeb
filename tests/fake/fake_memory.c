/* fake_memory.c — cuMemAlloc/cuMemFree (and async), memory info, copies, memsets, pools.
 *
 * Each cuMemAlloc allocation lives in a memfd (whole 2 MiB pages) mapped
 * shared, so that another process can map it through cuIpcOpenMemHandle
 * (fake_ipc.c): a memfd of its own, or for a request up to 1 MiB a place
 * in a 2 MiB one that several share (fake_chunks.c), as the real driver
 * sub-allocates them; cuMemAllocAsync memory always gets its own.  The
 * requested size rounded to 512 B counts against the device total, as
 * cuMemCreate memory does.  Copies and memsets run at once
 * on the host: the fake has no real queue.  Memory pools are one default
 * pool per device with nothing behind it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_state.h"

/* ---------------- bookkeeping ---------------- */

/* The memfd's name carries the buffer id, so that an importer can tell a
 * reused fd number from the allocation its handle describes. */
void fake_memfd_name(char* out, size_t n, unsigned long long id) { snprintf(out, n, "fake-cuda-%llu", id); }

void* fake_map_memfd(unsigned long long id, size_t len, int* fd_out) {
  char name[32];
  fake_memfd_name(name, sizeof name, id);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return NULL;
  void* p = ftruncate(fd, (off_t)len) == 0 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (p == MAP_FAILED) {
    close(fd);
    return NULL;
  }
  *fd_out = fd;
  return p;
}

/* `shared`: a small request may go into a shared mapping (cuMemAlloc). */
static CUresult add_allocation(CUdeviceptr* out, size_t size, int shared) {
  if (out == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = fake_check_current();
  if (r != CUDA_SUCCESS) return r;
  if (size > fake.stats.total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t rounded = fake_round_up(size, 512);
  if (fake.stats.live_bytes + rounded > fake.stats.total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  struct allocation a = {0};
  a.size = size;
  a.rounded = rounded;
  a.ctx = fake_current;
  a.buffer_id = fake.next_buffer_id++;
  if (shared && size <= fake_suballoc_max()) {
    if (!fake_chunk_place(&a)) return CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    a.mapping = fake_round_up(size, ALLOC_PAGE);
    a.map_id = a.buffer_id;
    a.ptr = fake_map_memfd(a.buffer_id, a.mapping, &a.fd);
    if (a.ptr == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (fake.nallocs == fake.cap_allocs) {
    fake.cap_allocs = fake.cap_allocs ? 2 * fake.cap_allocs : 64;
    fake.allocs = realloc(fake.allocs, fake.cap_allocs * sizeof *fake.allocs);
  }
  fake.allocs[fake.nallocs++] = a;
  fake.stats.live_bytes += rounded;
  fake.stats.live_allocs++;
  *out = (CUdeviceptr)(uintptr_t)a.ptr;
  return CUDA_SUCCESS;
}

void fake_free_allocation(size_t i) {
  struct allocation* a = &fake.allocs[i];
  if (a->chunk != NULL) {
    fake_chunk_release(a);
  } else {
    munmap(a->ptr, a->mapping);
    close(a->fd);
  }
  fake.stats.live_bytes -= a->rounded;
  fake.stats.live_allocs--;
  *a = fake.allocs[--fake.nallocs];
}

/* Frees an allocation the fake handed out; anything else (an interior
 * pointer, a pointer freed twice, memory of a destroyed context) is
 * CUDA_ERROR_INVALID_VALUE. */
static CUresult remove_allocation(CUdeviceptr ptr) {
  for (size_t i = 0; i < fake.nallocs; ++i) {
    if ((CUdeviceptr)(uintptr_t)fake.allocs[i].ptr != ptr) continue;
    fake_free_allocation(i);
    return CUDA_SUCCESS;
  }
  fake.stats.mem_free_invalid++;
  return CUDA_ERROR_INVALID_VALUE;
}

struct allocation* fake_find_allocation(CUdeviceptr p) {
  for (size_t i = 0; i < fake.nallocs; ++i) {
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)fake.allocs[i].ptr;
    if (p >= base && p - base < fake.allocs[i].size) return &fake.allocs[i];
  }
  return NULL;
}

/* ---------------- cuMemAlloc, cuMemFree ---------------- */

/* FAKE_CUDA_ALLOC_DELAY_US: each cuMemAlloc takes at least this long (a real
 * driver's takes tens of microseconds), so that tests can check where the
 * time inside the shim is attributed. */
static void alloc_delay(void) {
  static long us = -1;
  if (us < 0) us = (long)fake_env_size("FAKE_CUDA_ALLOC_DELAY_US", 0);
  if (us > 0) usleep((useconds_t)us);
}

/* The test's hook (fake_cuda_on_mem_alloc), outside the fake's lock. */
static void mem_alloc_hook(void) {
  fake_lock();
  void (*hook)(void*) = fake.on_mem_alloc;
  void* arg = fake.on_mem_alloc_arg;
  fake_unlock();
  if (hook) hook(arg);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t size) {
  alloc_delay();
  mem_alloc_hook();
  fake_lock();
  fake_init_once();
  CUresult r = fake_fault(FAULT_MEM_ALLOC);
  if (r == CUDA_SUCCESS && fake_capture_forbids_unsafe_call()) r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (r == CUDA_SUCCESS) {
    r = add_allocation(out, size, 1);
    if (r == CUDA_SUCCESS) fake.stats.mem_alloc++;
    else fake.stats.mem_alloc_failed++;
  }
  fake_unlock();
  return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  if (ptr == 0) return CUDA_SUCCESS;
  fake_lock();
  CUresult r = fake_capture_forbids_unsafe_call() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : remove_allocation(ptr);
  if (r == CUDA_SUCCESS) fake.stats.mem_free++;
  fake_unlock();
  return r;
}

static CUresult alloc_async(CUdeviceptr* out, size_t size, CUstream s, int ptsz) {
  fake_lock();
  fake_init_once();
  CUresult r = fake_fault(FAULT_MEM_ALLOC_ASYNC);
  if (r != CUDA_SUCCESS) {
    fake_unlock();
    return r;
  }
  r = add_allocation(out, size, 0);
  if (r == CUDA_SUCCESS && fake_resolve_stream(s, ptsz)->capturing) fake_find_allocation(*out)->graph = 1;
  if (r == CUDA_SUCCESS) {
    fake.stats.mem_alloc_async++;
    if (ptsz) fake.stats.mem_alloc_async_ptsz++;
  } else {
    fake.stats.mem_alloc_failed++;
  }
  fake_unlock();
  return r;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr* out, size_t size, CUstream s) { return alloc_async(out, size, s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* out, size_t size, CUstream s) { return alloc_async(out, size, s, 1); }

/* During a capture the real driver frees only graph allocations (made on a
 * capturing stream): any other pointer is CUDA_ERROR_INVALID_VALUE. */
static CUresult free_async(CUdeviceptr ptr, CUstream s, int ptsz) {
  if (ptr == 0) return CUDA_SUCCESS;
  fake_lock();
  struct allocation* a = fake_find_allocation(ptr);
  const int refused = fake_resolve_stream(s, ptsz)->capturing && (a == NULL || !a->graph);
  CUresult r = refused ? CUDA_ERROR_INVALID_VALUE : remove_allocation(ptr);
  if (r == CUDA_SUCCESS) {
    fake.stats.mem_free_async++;
    if (ptsz) fake.stats.mem_free_async_ptsz++;
  }
  fake_unlock();
  return r;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) { return free_async(ptr, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) { return free_async(ptr, s, 1); }

EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  fake_lock();
  fake_init_once();
  CUresult r = fake_check_current();
  if (r == CUDA_SUCCESS) {
    fake.stats.mem_get_info++;
    if (free_bytes) *free_bytes = fake.stats.total_bytes - fake.stats.live_bytes;
    if (total_bytes) *total_bytes = fake.stats.total_bytes;
  }
  fake_unlock();
  return r;
}

/* ---------------- copies and memsets ---------------- */

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
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) {
  if (dst % 4) return CUDA_ERROR_INVALID_VALUE;
  uint32_t* p = (uint32_t*)(uintptr_t)dst;
  for (size_t i = 0; i < n; ++i) p[i] = v;
  return CUDA_SUCCESS;
}

/* Between contexts (any two devices: no peer access needed). */
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  if (dst_ctx == NULL || src_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  fake_lock();
  int alive = dst_ctx->alive && src_ctx->alive;
  fake_unlock();
  if (!alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

/* ---------------- memory pools ---------------- */

static int default_pools[MAX_DEVICES];
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice d) {
  if (pool == NULL || d < 0 || d >= fake.device_count) return CUDA_ERROR_INVALID_VALUE;
  *pool = (CUmemoryPool)&default_pools[d];
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
  return pool != NULL && d >= 0 && d < fake.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return pool != NULL && (map != NULL || count == 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
