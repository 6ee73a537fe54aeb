/* host_behaviours.c — pinned host memory (shim/host_ops.h) as a route
 * behaviour: served from the cache, flags kept apart, reuse only after a
 * fence, the driver's answers about a block, foreign pointers and double
 * frees, no block handed across contexts (a context's death frees its
 * pinned memory).  The fake driver counts its host calls (fake_host.c); its
 * cuMemFreeHost waits for the device (host_free_syncs), as the real one
 * does, so a free that reached it shows.  A stream held busy
 * (fake_cuda_hold_stream) stands in for a copy still in flight. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "route_common.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* A second allocation of the same class makes no driver call; a free makes
 * none either (and never waits for the device). */
static int host_served(void) {
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK((void*)A->host_alloc != A->fake_raw("cuMemHostAlloc")); /* the route reached the shim */
  CHECK((void*)A->alloc_host != A->fake_raw("cuMemAllocHost_v2"));
  CHECK((void*)A->free_host != A->fake_raw("cuMemFreeHost"));
  CHECK((void*)A->host_get_flags != A->fake_raw("cuMemHostGetFlags"));
  CHECK((void*)A->host_get_device_pointer != A->fake_raw("cuMemHostGetDevicePointer_v2"));
  const struct fake_cuda_stats_t before = stats();
  CHECK_CU(A->host_alloc(&p, 5000, 0));
  CHECK(stats().host_alloc == before.host_alloc + 1);
  memset(p, 1, 5000);
  CHECK_CU(A->free_host(p));
  CHECK(stats().host_free == before.host_free);
  CHECK(stats().host_free_syncs == before.host_free_syncs);
  CHECK_CU(A->host_alloc(&q, 7000, 0)); /* the same class (8 KiB) */
  CHECK(q == p);
  CHECK(stats().host_alloc == before.host_alloc + 1);
  CHECK_CU(A->alloc_host(&r, 7000)); /* cuMemAllocHost: flags 0, the same pool */
  CHECK(r != q);
  CHECK_CU(A->free_host(r));
  void* again = NULL;
  CHECK_CU(A->alloc_host(&again, 8 * KiB));
  CHECK(again == r);
  CHECK(stats().host_alloc == before.host_alloc + 2);
  CHECK_CU(A->free_host(q));
  CHECK_CU(A->free_host(again));
  CHECK(stats().host_free == before.host_free);
  return 0;
}

/* Portable, mapped and write-combined blocks never serve each other, and
 * each reports what the driver reports for a fresh allocation of its
 * flags: those asked | DEVICEMAP (unified addressing). */
static int host_flags(void) {
  const unsigned kinds[] = {0, CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE,
                            CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED};
  void* first[4];
  for (int i = 0; i < 4; ++i) {
    CHECK_CU(A->host_alloc(&first[i], 64 * KiB, kinds[i]));
    CHECK_CU(A->free_host(first[i]));
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < i; ++j) CHECK(first[i] != first[j]);
  for (int i = 3; i >= 0; --i) {
    void* p = NULL;
    unsigned flags = 99;
    CHECK_CU(A->host_alloc(&p, 64 * KiB, kinds[i]));
    CHECK(p == first[i]);
    CHECK_CU(A->host_get_flags(&flags, p));
    CHECK(flags == (kinds[i] | CU_MEMHOSTALLOC_DEVICEMAP));
  }
  CHECK(stats().host_alloc == 4);
  return 0;
}

/* The driver carves small pinned allocations from shared chunks and answers
 * cuMemHostGetFlags with the chunk's flags (its first allocation's) |
 * DEVICEMAP (fake_host.c, as measured on an H100).  A block the cache keeps
 * — freed by the program, or live — keeps its chunk alive, so a later
 * portable block lands in a flags-0 chunk and the driver says 0x2 where a
 * bare run, whose chunk went with its free, says 0x3.  The shim answers
 * what the driver answers for a fresh allocation of the flags asked:
 * asked | DEVICEMAP.  Address range and attributes are the block's own. */
static int host_flags_shared_chunk(void) {
  PFN_cuMemHostGetFlags_v2030 raw_flags = (PFN_cuMemHostGetFlags_v2030)A->fake_raw("cuMemHostGetFlags");
  const unsigned PORTABLE = CU_MEMHOSTALLOC_PORTABLE, MAPPED = CU_MEMHOSTALLOC_DEVICEMAP;
  const unsigned WC = CU_MEMHOSTALLOC_WRITECOMBINED;
  void *cached = NULL, *live = NULL, *p = NULL, *q = NULL, *r = NULL, *w = NULL;
  unsigned flags = 0;
  CHECK(raw_flags != NULL);
  /* Only a cached flags-0 block holds the chunk. */
  CHECK_CU(A->host_alloc(&cached, 64 * KiB, 0));
  CHECK_CU(A->free_host(cached));
  CHECK_CU(A->host_alloc(&p, 40000, PORTABLE));
  CHECK_CU(raw_flags(&flags, p));
  CHECK(flags == MAPPED); /* the chunk's: the gap is there to hide */
  CHECK_CU(A->host_get_flags(&flags, p));
  CHECK(flags == (PORTABLE | MAPPED));
  CHECK_CU(A->host_get_flags(&flags, (char*)p + 39999));
  CHECK(flags == (PORTABLE | MAPPED));
  CHECK(A->host_get_flags(&flags, cached) == CUDA_ERROR_INVALID_VALUE); /* cached: unknown */
  /* A live flags-0 block (and the cached one) beside new requests. */
  CHECK_CU(A->host_alloc(&live, 64 * KiB, 0));
  CHECK(live == cached);
  CHECK_CU(A->host_alloc(&q, 64 * KiB, PORTABLE | MAPPED));
  CHECK_CU(A->host_alloc(&r, 64 * KiB, MAPPED));
  CHECK_CU(A->host_alloc(&w, 64 * KiB, PORTABLE | WC));
  CHECK_CU(A->host_get_flags(&flags, live));
  CHECK(flags == MAPPED);
  CHECK_CU(A->host_get_flags(&flags, q));
  CHECK(flags == (PORTABLE | MAPPED));
  CHECK_CU(A->host_get_flags(&flags, r));
  CHECK(flags == MAPPED);
  CHECK_CU(A->host_get_flags(&flags, w));
  CHECK(flags == (PORTABLE | WC | MAPPED));
  /* Chunking changes no range: each block is exactly its request. */
  const CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
  CUdeviceptr base = 0, start = 0, dev = 0;
  size_t size = 0, range = 0;
  CHECK_CU(A->get_address_range(&base, &size, a + 100));
  CHECK(base == a && size == 40000);
  CHECK(A->get_address_range(&base, &size, a + 40000) == CUDA_ERROR_NOT_FOUND);
  CHECK_CU(A->pointer_get_attribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 10));
  CHECK(range == 40000);
  CHECK_CU(A->pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 10));
  CHECK(start == a);
  CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  start = 0;
  range = 0;
  void* into[2] = {&start, &range};
  CHECK_CU(A->pointer_get_attributes(2, which, into, a + 39999));
  CHECK(start == a && range == 40000);
  CHECK_CU(A->host_get_device_pointer(&dev, q, 0));
  CHECK(dev == (CUdeviceptr)(uintptr_t)q);
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->free_host(q));
  CHECK_CU(A->free_host(r));
  CHECK_CU(A->free_host(w));
  CHECK_CU(A->free_host(live));
  return 0;
}

/* A copy from p is still in flight on `s` when p is freed: the next
 * allocation of its class is not p until the copy completed, and nothing
 * waited for the device or the copy on the way. */
static int reuse_waits(CUstream s) {
  void *p = NULL, *q = NULL, *r = NULL;
  CUdeviceptr d = 0;
  CHECK_CU(A->mem_alloc(&d, MiB));
  CHECK_CU(A->host_alloc(&p, MiB, 0));
  A->fake_hold(s, 1);
  CHECK_CU(A->memcpy_htod_async(d, p, MiB, s)); /* still running */
  const struct fake_cuda_stats_t before = stats();
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->host_alloc(&q, MiB, 0));
  CHECK(q != p);
  CHECK(stats().host_free_syncs == before.host_free_syncs);
  CHECK(stats().ctx_sync == before.ctx_sync && stats().event_sync == before.event_sync);
  CHECK(stats().stream_sync == before.stream_sync);
  A->fake_hold(s, 0); /* the copy completed */
  CHECK_CU(A->host_alloc(&r, MiB, 0));
  CHECK(r == p);
  CHECK(stats().host_alloc == before.host_alloc + 1);
  CHECK_CU(A->free_host(q));
  CHECK_CU(A->free_host(r));
  CHECK_CU(A->mem_free(d));
  return 0;
}
static int host_reuse_legacy(void) { return reuse_waits(CU_STREAM_LEGACY); }
static int host_reuse_nonblocking(void) {
  CUstream s;
  CHECK_CU(A->stream_create(&s, CU_STREAM_NON_BLOCKING));
  int r = reuse_waits(s);
  CHECK_CU(A->stream_destroy(s));
  return r;
}

/* A portable block allocated in context c1 is copied from on a stream of
 * context c2, still running when it is freed: the fence covers c2 too. */
static int host_reuse_other_context(void) {
  ctx_create_fn create = (ctx_create_fn)A->fake_raw("cuCtxCreate_v2");
  CUcontext c1, c2;
  CUstream s2;
  CUdeviceptr d = 0;
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK(create != NULL);
  CHECK_CU(create(&c2, 0, 0));
  CHECK_CU(A->stream_create(&s2, CU_STREAM_NON_BLOCKING));
  CHECK_CU(A->mem_alloc(&d, MiB)); /* c2 is known to the shim */
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(A->host_alloc(&p, MiB, CU_MEMHOSTALLOC_PORTABLE));
  CHECK_CU(A->ctx_set_current(c2));
  A->fake_hold(s2, 1);
  CHECK_CU(A->memcpy_htod_async(d, p, MiB, s2));
  CHECK_CU(A->ctx_set_current(c1));
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->host_alloc(&q, MiB, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(q != p);
  A->fake_hold(s2, 0);
  CHECK_CU(A->host_alloc(&r, MiB, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(r == p);
  CHECK(stats().dead_context_calls == 0);
  return 0;
}

/* During a global-mode capture no fence is recorded (an event on the
 * legacy stream would break it): a freed block waits, and the capture
 * stays valid. */
static int host_during_capture(void) {
  CUstream s;
  CUgraph g;
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->host_alloc(&p, 64 * KiB, 0));
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->host_alloc(&q, 64 * KiB, 0));
  CHECK(q != p);
  CHECK_CU(A->end_capture(s, &g));
  CHECK(stats().capture_invalidations == 0);
  CHECK_CU(A->host_alloc(&r, 64 * KiB, 0));
  CHECK(r == p);
  return 0;
}

/* A destroyed context takes its pinned memory along: its cached blocks are
 * never handed out again, and a free of one it still held is the driver's
 * business. */
static int host_context_destroyed(void) {
  ctx_create_fn create = (ctx_create_fn)A->fake_raw("cuCtxCreate_v2");
  CUcontext c1;
  void *live = NULL, *cached = NULL, *portable = NULL, *p = NULL, *q = NULL;
  CHECK(create != NULL);
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(A->host_alloc(&live, 64 * KiB, 0));
  CHECK_CU(A->host_alloc(&cached, 64 * KiB, 0));
  CHECK_CU(A->host_alloc(&portable, 64 * KiB, CU_MEMHOSTALLOC_PORTABLE));
  CHECK_CU(A->free_host(cached));
  CHECK_CU(A->free_host(portable));
  CHECK_CU(A->ctx_destroy(c1));
  CHECK(stats().host_dropped_with_context == 3);
  CHECK_CU(A->ctx_set_current(g_ctx));
  /* (Before anything new is allocated: the freed address may come back.) */
  const unsigned long invalid = stats().host_free_invalid;
  CHECK(A->free_host(live) == CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().host_free_invalid == invalid + 1);
  CHECK_CU(A->host_alloc(&p, 64 * KiB, CU_MEMHOSTALLOC_PORTABLE));
  CHECK_CU(A->host_alloc(&q, 64 * KiB, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(stats().host_alloc == 5);
  memset(p, 1, 64 * KiB);
  memset(q, 2, 64 * KiB);
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->free_host(q));
  return 0;
}

/* A block freed in one context and a request of the same class and flags
 * in another (issue 34, item 4): the driver frees a context's pinned
 * memory, portable or not, when the context is destroyed, so the second
 * context's buffer must not be the first one's cached block.  After the
 * first context's death the buffer answers and frees as a fresh
 * allocation of the second does on the bare driver, and its memory stays
 * usable.  `reverse` frees in the newer context and asks in the older. */
static int host_handover(unsigned flags, int reverse) {
  ctx_create_fn create = (ctx_create_fn)A->fake_raw("cuCtxCreate_v2");
  CUcontext c1, c2;
  void *p = NULL, *q = NULL, *dead = NULL;
  unsigned got = 0;
  CHECK(create != NULL);
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(create(&c2, 0, 0));
  const CUcontext from = reverse ? c2 : c1, to = reverse ? c1 : c2;
  CHECK_CU(A->ctx_set_current(from));
  CHECK_CU(A->host_alloc(&p, 64 * KiB, flags));
  CHECK_CU(A->host_alloc(&dead, 64 * KiB, flags)); /* held at from's death */
  memset(p, 1, 64 * KiB);
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->ctx_set_current(to));
  CHECK_CU(A->host_alloc(&q, 64 * KiB, flags));
  memset(q, 2, 64 * KiB);
  CHECK_CU(A->ctx_destroy(from));
  CHECK_CU(A->ctx_set_current(to));
  CHECK_CU(A->host_get_flags(&got, q));
  CHECK(got == (flags | CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr alias = 0;
  CHECK_CU(A->host_get_device_pointer(&alias, q, 0));
  for (size_t i = 0; i < 64 * KiB; i += 4093) CHECK(((unsigned char*)q)[i] == 2);
  memset(q, 3, 64 * KiB);
  CHECK_CU(A->free_host(q));
  CHECK(A->host_get_flags(&got, dead) != CUDA_SUCCESS); /* died with its context */
  /* The cache still serves `to`: the freed block comes back. */
  void* again = NULL;
  CHECK_CU(A->host_alloc(&again, 64 * KiB, flags));
  memset(again, 4, 64 * KiB);
  CHECK_CU(A->free_host(again));
  CHECK_CU(A->ctx_destroy(to));
  CHECK_CU(A->ctx_set_current(g_ctx));
  CHECK(stats().dead_context_calls == 0);
  return 0;
}
static int host_handover_portable(void) { return host_handover(CU_MEMHOSTALLOC_PORTABLE, 0); }
static int host_handover_portable_reverse(void) { return host_handover(CU_MEMHOSTALLOC_PORTABLE, 1); }
static int host_handover_portable_mapped(void) {
  return host_handover(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP, 0);
}
static int host_handover_plain(void) { return host_handover(0, 0); }

/* What the driver says about a block: an allocation of the requested size
 * with the flags asked, its own device alias; nothing once freed. */
static int host_attributes(void) {
  void* p = NULL;
  CHECK_CU(A->host_alloc(&p, 5000, CU_MEMHOSTALLOC_DEVICEMAP));
  const CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
  CUdeviceptr base = 0, start = 0, dev = 0;
  size_t size = 0, range = 0;
  unsigned type = 0, flags = 0;
  unsigned long long id1 = 0, id2 = 0;
  CHECK_CU(A->get_address_range(&base, &size, a + 100));
  CHECK(base == a && size == 5000);
  CHECK(A->get_address_range(&base, &size, a + 5000) == CUDA_ERROR_NOT_FOUND);
  CHECK_CU(A->pointer_get_attribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 10));
  CHECK(range == 5000);
  CHECK_CU(A->pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 10));
  CHECK(start == a);
  CHECK_CU(A->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a));
  CHECK(type == CU_MEMORYTYPE_HOST);
  CHECK(A->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 6000) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(A->pointer_get_attribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
  CHECK_CU(A->host_get_flags(&flags, (char*)p + 4999));
  CHECK(flags == CU_MEMHOSTALLOC_DEVICEMAP);
  CHECK(A->host_get_flags(&flags, (char*)p + 5000) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(A->host_get_device_pointer(&dev, (char*)p + 64, 0));
  PFN_cuMemHostGetDevicePointer_v3020 raw = (PFN_cuMemHostGetDevicePointer_v3020)A->fake_raw("cuMemHostGetDevicePointer_v2");
  CUdeviceptr expected = 0;
  CHECK_CU(raw(&expected, (char*)p + 64, 0));
  CHECK(dev == expected);
  CHECK_CU(A->free_host(p));
  /* Freed: unknown to every query. */
  CHECK(A->host_get_flags(&flags, p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(A->host_get_device_pointer(&dev, p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(A->get_address_range(&base, &size, a) == CUDA_ERROR_NOT_FOUND);
  CHECK(A->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) == CUDA_ERROR_INVALID_VALUE);
  /* Served again: a new allocation, a new buffer id. */
  void* q = NULL;
  CHECK_CU(A->host_alloc(&q, 6000, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(q == p);
  CHECK_CU(A->pointer_get_attribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
  CHECK(id2 != id1);
  CHECK_CU(A->pointer_get_attribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a));
  CHECK(range == 6000);
  CHECK_CU(A->free_host(q));
  return 0;
}

/* Memory the shim never served is the driver's: its own pinned memory,
 * registered ranges, and pointers nobody allocated. */
static int host_foreign(void) {
  PFN_cuMemHostAlloc_v2020 raw_alloc = (PFN_cuMemHostAlloc_v2020)A->fake_raw("cuMemHostAlloc");
  void* f = NULL;
  CHECK_CU(raw_alloc(&f, 3 * KiB, CU_MEMHOSTALLOC_PORTABLE));
  unsigned flags = 0;
  CHECK_CU(A->host_get_flags(&flags, f));
  CHECK(flags == (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)); /* the driver's own answer */
  size_t size = 0;
  CUdeviceptr base = 0;
  CHECK_CU(A->get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)f));
  CHECK(size == 3 * KiB);
  const struct fake_cuda_stats_t before = stats();
  CHECK_CU(A->free_host(f));
  CHECK(stats().host_free == before.host_free + 1);
  int local = 0;
  CHECK(A->free_host(&local) == CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().host_free_invalid == before.host_free_invalid + 1);
  /* A registered range: the program's memory, never a block. */
  char* mine = aligned_alloc(4096, 64 * KiB);
  CHECK(mine != NULL);
  CHECK_CU(A->host_register(mine, 64 * KiB, CU_MEMHOSTREGISTER_DEVICEMAP));
  CHECK(A->free_host(mine) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(A->get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)(mine + 10)));
  CHECK(size == 64 * KiB);
  void* p = NULL;
  CHECK_CU(A->host_alloc(&p, 64 * KiB, 0));
  CHECK((char*)p + 64 * KiB <= mine || (char*)p >= mine + 64 * KiB);
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->host_unregister(mine));
  free(mine);
  return 0;
}

/* A double free and an interior pointer get the driver's error; the block
 * stays usable. */
static int host_double_free(void) {
  void* p = NULL;
  CHECK_CU(A->host_alloc(&p, 10 * KiB, 0));
  CHECK(A->free_host((char*)p + 8) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(A->free_host(p));
  CHECK(A->free_host(p) == CUDA_ERROR_INVALID_VALUE);
  void* q = NULL;
  CHECK_CU(A->host_alloc(&q, 10 * KiB, 0));
  CHECK(q == p);
  CHECK_CU(A->free_host(q));
  return 0;
}

/* The driver refuses the class size even with the cache emptied: the
 * request goes to it with its exact size, uncached, and the driver answers. */
static int host_oom_exact_size(void) {
  void *cached = NULL, *p = NULL;
  CHECK_CU(A->host_alloc(&cached, 4 * KiB, 0));
  CHECK_CU(A->free_host(cached)); /* waiting: emptying the cache releases it */
  A->fake_fail("cuMemHostAlloc", 0, 2, CUDA_ERROR_OUT_OF_MEMORY); /* the class size, then its retry */
  CHECK_CU(A->host_alloc(&p, 5 * MiB, 0));
  CHECK(stats().failures_injected == 2);
  CHECK(stats().host_free == 1); /* the cached block went back before the retry */
  size_t size = 0;
  CUdeviceptr base = 0;
  CHECK_CU(A->get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)p));
  CHECK(size == 5 * MiB); /* the driver's allocation of the exact size */
  CHECK_CU(A->free_host(p));
  CHECK(stats().host_free == 2); /* not a cached block: the driver freed it */
  A->fake_fail("cuMemHostAlloc", 0, -1, CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(A->host_alloc(&p, 4 * KiB, 0) == CUDA_ERROR_OUT_OF_MEMORY); /* the driver's own answer */
  A->fake_fail("cuMemHostAlloc", 0, 0, CUDA_SUCCESS);
  return 0;
}

/* pinned_max_cached_mb:0: every call is the driver's. */
static int host_off(void) {
  void *p = NULL, *q = NULL;
  CHECK_CU(A->host_alloc(&p, 4 * KiB, 0));
  CHECK_CU(A->free_host(p));
  CHECK_CU(A->host_alloc(&q, 4 * KiB, 0));
  CHECK_CU(A->free_host(q));
  CHECK(stats().host_alloc == 2 && stats().host_free == 2);
  return 0;
}

static const struct {
  const char* name;
  behaviour_fn run;
} cases[] = {
  {"host_served", host_served},
  {"host_flags", host_flags},
  {"host_flags_shared_chunk", host_flags_shared_chunk},
  {"host_reuse_legacy", host_reuse_legacy},
  {"host_reuse_nonblocking", host_reuse_nonblocking},
  {"host_reuse_other_context", host_reuse_other_context},
  {"host_during_capture", host_during_capture},
  {"host_context_destroyed", host_context_destroyed},
  {"host_handover_portable", host_handover_portable},
  {"host_handover_portable_reverse", host_handover_portable_reverse},
  {"host_handover_portable_mapped", host_handover_portable_mapped},
  {"host_handover_plain", host_handover_plain},
  {"host_attributes", host_attributes},
  {"host_foreign", host_foreign},
  {"host_double_free", host_double_free},
  {"host_oom_exact_size", host_oom_exact_size},
  {"host_off", host_off},
};

behaviour_fn host_behaviour(const char* name) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
    if (strcmp(cases[i].name, name) == 0) return cases[i].run;
  return NULL;
}
