/* fake_host.c — page-locked host memory: cuMemHostAlloc and its family.
 *
 * Pinned memory is page-aligned malloc'ed memory with its flags
 * remembered; registered ranges (cuMemHostRegister) sit in the same list,
 * marked, so that the shim's tests can check it never takes one for a
 * block of its own.  Like the real driver (measured on an H100),
 * cuMemFreeHost waits for the device: it completes all work enqueued so
 * far, counted in host_free_syncs, which lets a test see whether the shim's
 * free path reached it.  A destroyed context takes its pinned memory and
 * registrations along (assumed, not measured on a real driver).
 *
 * Chunks, as the real driver's (H100, driver 580, CUDA 13): small
 * allocations are carved, page by page, first fit, from 2 MiB chunks that
 * consecutive allocations share (256 KiB requests came back at adjacent
 * addresses, 0x...e00000, +0x40000, +0x80000), and cuMemHostGetFlags of any
 * allocation in a chunk answers the flags of the allocation that created
 * the chunk: with a flags-0 allocation live, a PORTABLE request placed in
 * its chunk reports 0x2 where a fresh process reports 0x3.  Write-combined
 * requests land in chunks of their own flags (their answers were right);
 * 1 MiB requests each got a mapping of their own, so only requests below
 * FAKE_CUDA_HOST_SUBALLOC_BELOW (bytes, default 1 MiB; 0: never) are
 * carved.  Assumed, not measured: chunks are per context (as the device
 * chunks of fake_chunks.c), a freed place is reused, and a chunk goes with
 * its last allocation (so a later request starts a fresh one).
 *
 * Answers as a driver with unified addressing (every 64-bit system):
 * cuMemHostGetFlags is the chunk's (or the allocation's own) flags |
 * DEVICEMAP (measured: asked 0 -> 0x2, 0x1 -> 0x3, 0x4 -> 0x6 ...), and
 * cuMemHostGetDevicePointer answers for any allocation whose flags say
 * DEVICEMAP — so for every allocation, and for ranges registered with
 * CU_MEMHOSTREGISTER_DEVICEMAP (a registration's flags are answered as
 * given).  Choices where the real driver's answer is not known: size 0 and
 * unknown flag bits are CUDA_ERROR_INVALID_VALUE. */
#include <stdlib.h>
#include <string.h>

#include "fake_state.h"

#define HOST_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)
#define CHUNK_PAGES (HOST_CHUNK / PAGE)

/* ---------------- chunks ---------------- */

static size_t suballoc_below(void) {
  static size_t below = (size_t)-1;
  if (below == (size_t)-1) below = fake_env_size("FAKE_CUDA_HOST_SUBALLOC_BELOW", (size_t)1 << 20);
  return below;
}

static int page_used(const struct host_chunk* c, size_t i) { return (c->used[i / 8] >> (i % 8)) & 1; }
static void mark_pages(struct host_chunk* c, size_t from, size_t n, int on) {
  for (size_t i = from; i < from + n; ++i) {
    if (on) c->used[i / 8] |= (unsigned char)(1u << (i % 8));
    else c->used[i / 8] &= (unsigned char)~(1u << (i % 8));
  }
}

/* The first run of n free pages in c, or CHUNK_PAGES when none. */
static size_t first_free_run(const struct host_chunk* c, size_t n) {
  size_t run = 0;
  for (size_t i = 0; i < CHUNK_PAGES; ++i) {
    run = page_used(c, i) ? 0 : run + 1;
    if (run == n) return i + 1 - n;
  }
  return CHUNK_PAGES;
}

/* Write-combined allocations share only with the same flags; all others
 * share with each other, whatever their flags (the driver's behaviour). */
static int chunk_takes(const struct host_chunk* c, unsigned flags, struct CUctx_st* ctx) {
  if (c->ctx != ctx) return 0;
  if (flags & CU_MEMHOSTALLOC_WRITECOMBINED) return c->flags == flags;
  return (c->flags & CU_MEMHOSTALLOC_WRITECOMBINED) == 0;
}

static struct host_chunk* new_chunk(unsigned flags, struct CUctx_st* ctx) {
  struct host_chunk* c = calloc(1, sizeof *c);
  void* base = aligned_alloc(HOST_CHUNK, HOST_CHUNK);
  if (c == NULL || base == NULL) {
    free(c);
    free(base);
    return NULL;
  }
  c->base = base;
  c->flags = flags;
  c->ctx = ctx;
  c->next = fake.host_chunks;
  fake.host_chunks = c;
  return c;
}

/* Memory for b (size, flags, ctx filled): a place in a chunk when small,
 * else pages of its own.  0 when no memory (lock held). */
static int place(struct host_block* b) {
  if (b->size >= suballoc_below()) return (b->ptr = aligned_alloc(PAGE, fake_round_up(b->size, PAGE))) != NULL;
  const size_t n = fake_round_up(b->size, PAGE) / PAGE;
  struct host_chunk* c = fake.host_chunks;
  size_t at = CHUNK_PAGES;
  for (; c != NULL; c = c->next)
    if (chunk_takes(c, b->flags, b->ctx) && (at = first_free_run(c, n)) < CHUNK_PAGES) break;
  if (c == NULL) {
    if ((c = new_chunk(b->flags, b->ctx)) == NULL) return 0;
    at = 0;
  }
  mark_pages(c, at, n, 1);
  c->users++;
  b->chunk = c;
  b->ptr = (char*)c->base + at * PAGE;
  return 1;
}

/* Gives b's memory back; a chunk goes with its last allocation (lock held). */
static void unplace(struct host_block* b) {
  struct host_chunk* c = b->chunk;
  if (c == NULL) {
    free(b->ptr);
    return;
  }
  const size_t from = (size_t)((char*)b->ptr - (char*)c->base) / PAGE;
  mark_pages(c, from, fake_round_up(b->size, PAGE) / PAGE, 0);
  if (--c->users != 0) return;
  struct host_chunk** link = &fake.host_chunks;
  while (*link != c) link = &(*link)->next;
  *link = c->next;
  free(c->base);
  free(c);
}

/* What cuMemHostGetFlags answers for b: a registration's flags as given;
 * an allocation's chunk's flags, plus DEVICEMAP (unified addressing). */
static unsigned reported_flags(const struct host_block* b) {
  if (b->registered) return b->flags;
  return (b->chunk ? b->chunk->flags : b->flags) | CU_MEMHOSTALLOC_DEVICEMAP;
}

/* ---------------- blocks ---------------- */

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
      unplace(b);
    }
    free(b);
  }
}

static CUresult host_alloc(void** pp, size_t size, unsigned flags) {
  if (pp == NULL || size == 0 || (flags & ~HOST_FLAGS) != 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_fault(FAULT_MEM_HOST_ALLOC);
  if (r == CUDA_SUCCESS) r = fake_check_current();
  struct host_block* b = NULL;
  if (r == CUDA_SUCCESS) {
    b = calloc(1, sizeof *b);
    if (b == NULL) r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    b->size = size;
    b->flags = flags;
    b->ctx = fake_current;
    if (!place(b)) r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r != CUDA_SUCCESS) {
    free(b);
    fake.stats.host_alloc_failed++;
    fake_unlock();
    return r;
  }
  memset(b->ptr, 0xA5, size); /* not zeroed: a test must not rely on fresh contents */
  b->buffer_id = fake.next_buffer_id++;
  b->next = fake.host_blocks;
  fake.host_blocks = b;
  fake.stats.host_alloc++;
  fake.stats.live_host_allocs++;
  fake_unlock();
  *pp = b->ptr;
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
  unplace(b);
  fake_unlock();
  free(b);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  fake.stats.host_get_flags++;
  struct host_block* b = fake_find_host((uintptr_t)p);
  if (b) *flags = reported_flags(b);
  fake_unlock();
  return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* out, void* p, unsigned int flags) {
  if (out == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  fake.stats.host_get_device_pointer++;
  struct host_block* b = fake_find_host((uintptr_t)p);
  int ok = b && (reported_flags(b) & CU_MEMHOSTALLOC_DEVICEMAP);
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
