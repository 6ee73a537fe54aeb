/* fake_host.c — page-locked host memory: cuMemHostAlloc and its family.
 *
 * Pinned memory is page-aligned malloc'ed memory with its flags
 * remembered; registered ranges (cuMemHostRegister) sit in the same list,
 * marked, so that the shim's tests can check it never takes one for a
 * block of its own.  Like the real driver (measured on an H100),
 * cuMemFreeHost waits for the device: it completes all work enqueued so
 * far, counted in host_free_syncs, which lets a test see whether the shim's
 * free path reached it.  A destroyed context takes its pinned memory and
 * registrations along (assumed, not measured on a real driver).  Choices where the real driver's answer is not
 * known: size 0 and unknown flag bits are CUDA_ERROR_INVALID_VALUE;
 * cuMemHostGetFlags answers the flags as given (a real driver with unified
 * addressing adds portable | device-mapped); cuMemHostGetDevicePointer
 * requires the device-mapped flag (the pre-unified-addressing rule, which
 * keeps flags observable) and answers the host address. */
#include <stdlib.h>
#include <string.h>

#include "fake_state.h"

#define HOST_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)

static struct host_block* find_exact(void* p) {
  for (struct host_block* b = fake.host_blocks; b; b = b->next)
    if (b->ptr == p) return b;
  return NULL;
}

struct host_block* fake_find_host(uintptr_t p) {
  for (struct host_block* b = fake.host_blocks; b; b = b->next)
    if (p >= (uintptr_t)b->ptr && p < (uintptr_t)b->ptr + b->size) return b;
  return NULL;
}

void fake_drop_host_of(struct CUctx_st* c) {
  for (struct host_block** link = &fake.host_blocks; *link;) {
    struct host_block* b = *link;
    if (b->ctx != c) {
      link = &b->next;
      continue;
    }
    *link = b->next;
    if (!b->registered) {
      fake.stats.live_host_allocs--;
      fake.stats.host_dropped_with_context++;
      free(b->ptr);
    }
    free(b);
  }
}

static CUresult host_alloc(void** pp, size_t size, unsigned flags) {
  if (pp == NULL || size == 0 || (flags & ~HOST_FLAGS) != 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_fault(FAULT_MEM_HOST_ALLOC);
  if (r == CUDA_SUCCESS) r = fake_check_current();
  void* p = NULL;
  struct host_block* b = NULL;
  if (r == CUDA_SUCCESS) {
    p = aligned_alloc(PAGE, fake_round_up(size, PAGE));
    b = calloc(1, sizeof *b);
    if (p == NULL || b == NULL) r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r != CUDA_SUCCESS) {
    free(p);
    free(b);
    fake.stats.host_alloc_failed++;
    fake_unlock();
    return r;
  }
  memset(p, 0xA5, size); /* not zeroed: a test must not rely on fresh contents */
  b->ptr = p;
  b->size = size;
  b->flags = flags;
  b->ctx = fake_current;
  b->buffer_id = fake.next_buffer_id++;
  b->next = fake.host_blocks;
  fake.host_blocks = b;
  fake.stats.host_alloc++;
  fake.stats.live_host_allocs++;
  fake_unlock();
  *pp = p;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void** pp, size_t size, unsigned int flags) { return host_alloc(pp, size, flags); }
EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t size) { return host_alloc(pp, size, 0); }

EXPORT CUresult cuMemFreeHost(void* p) {
  fake_lock();
  struct host_block* b = find_exact(p);
  if (b == NULL || b->registered) {
    fake.stats.host_free_invalid++;
    fake_unlock();
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct host_block** link = &fake.host_blocks;
  while (*link != b) link = &(*link)->next;
  *link = b->next;
  fake.stats.host_free++;
  fake.stats.host_free_syncs++;
  fake.stats.live_host_allocs--;
  fake_complete_all_streams(); /* the real driver waits for the device here */
  fake_unlock();
  free(b->ptr);
  free(b);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  fake.stats.host_get_flags++;
  struct host_block* b = fake_find_host((uintptr_t)p);
  if (b) *flags = b->flags;
  fake_unlock();
  return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* out, void* p, unsigned int flags) {
  if (out == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  fake.stats.host_get_device_pointer++;
  struct host_block* b = fake_find_host((uintptr_t)p);
  int ok = b && (b->flags & CU_MEMHOSTALLOC_DEVICEMAP);
  if (ok) *out = (CUdeviceptr)(uintptr_t)p;
  fake_unlock();
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The program's own memory, pinned in place. */
EXPORT CUresult cuMemHostRegister_v2(void* p, size_t size, unsigned int flags) {
  if (p == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_check_current();
  if (r == CUDA_SUCCESS && (fake_find_host((uintptr_t)p) || fake_find_host((uintptr_t)p + size - 1)))
    r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  struct host_block* b = r == CUDA_SUCCESS ? calloc(1, sizeof *b) : NULL;
  if (b) {
    b->ptr = p;
    b->size = size;
    b->flags = flags & HOST_FLAGS;
    b->registered = 1;
    b->ctx = fake_current;
    b->buffer_id = fake.next_buffer_id++;
    b->next = fake.host_blocks;
    fake.host_blocks = b;
    fake.stats.host_register++;
  }
  fake_unlock();
  return r;
}

EXPORT CUresult cuMemHostUnregister(void* p) {
  fake_lock();
  struct host_block* b = find_exact(p);
  if (b == NULL || !b->registered) {
    fake_unlock();
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  struct host_block** link = &fake.host_blocks;
  while (*link != b) link = &(*link)->next;
  *link = b->next;
  fake.stats.host_unregister++;
  fake_unlock();
  free(b);
  return CUDA_SUCCESS;
}
