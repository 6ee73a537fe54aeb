/* thread_cache_behaviours.c — the per-thread front caches
 * (core/thread_cache.h) through the shim's cuMemAlloc_v2 / cuMemFree_v2:
 * a block waiting in a thread's cache answers every query as freed memory,
 * frees from other threads, thread exit and cachalloc_empty_cache give the
 * caches' blocks back, and many threads churning small blocks never get
 * one block twice; a free with another context current goes to the
 * owner's cache.  Each runs as a route behaviour under the shim. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "route_common.h"

typedef int (*empty_cache_fn)(int);

/* cachalloc_empty_cache from the preloaded shim. */
static empty_cache_fn empty_cache(void) { return (empty_cache_fn)dlsym(RTLD_DEFAULT, "cachalloc_empty_cache"); }

/* A freed 4 KiB block (in this thread's cache now) answers as freed
 * memory: no address range, no pointer attribute; its reuse answers as a
 * new allocation of the new size. */
static int tc_freed_queries(void) {
  CUdeviceptr p = 0, q = 0, base = 0;
  size_t size = 0;
  CHECK_CU(A->mem_alloc(&p, 4096));
  CHECK_CU(A->get_address_range(&base, &size, p));
  CHECK(base == p && size == 4096);
  CHECK_CU(A->mem_free(p));
  CHECK(A->get_address_range(&base, &size, p) != CUDA_SUCCESS);
  CUdeviceptr start = 0;
  CHECK(A->pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS);
  unsigned long long id1 = 0, id2 = 0;
  CHECK_CU(A->mem_alloc(&q, 3700)); /* the same rounded size (4 KiB): the cached block */
  CHECK(q == p);
  CHECK_CU(A->get_address_range(&base, &size, q));
  CHECK(base == q && size == 3700);
  CHECK_CU(A->pointer_get_attribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  CHECK_CU(A->mem_free(q));
  CHECK_CU(A->mem_alloc(&q, 3900));
  CHECK(q == p);
  CHECK_CU(A->pointer_get_attribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  CHECK(id1 != id2); /* a fresh allocation identity each time */
  CHECK(A->mem_free(q) == CUDA_SUCCESS);
  CHECK(A->mem_free(q) != CUDA_SUCCESS); /* double free of a cached block */
  CHECK(stats().mem_free_invalid == 0);
  return 0;
}

struct handoff {
  CUdeviceptr p;
  int ok;
};

static void* free_there(void* arg) {
  struct handoff* h = arg;
  h->ok = A->ctx_set_current(g_ctx) == CUDA_SUCCESS && A->mem_free(h->p) == CUDA_SUCCESS;
  return NULL;
}

/* A block the main thread's cache handed out, freed by another thread:
 * freed (a query says so, a second free fails), and the main thread's next
 * allocation does not hand it out while another block holds it. */
static int tc_cross_thread_free(void) {
  CUdeviceptr p = 0, q = 0, r = 0, base = 0;
  size_t size = 0;
  CHECK_CU(A->mem_alloc(&p, 512));
  CHECK_CU(A->mem_free(p)); /* into this thread's cache */
  CHECK_CU(A->mem_alloc(&q, 512));
  CHECK(q == p);
  struct handoff h = {q, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, free_there, &h) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(h.ok);
  CHECK(A->get_address_range(&base, &size, q) != CUDA_SUCCESS);
  CHECK(A->mem_free(q) != CUDA_SUCCESS);
  CHECK_CU(A->mem_alloc(&r, 512));
  CUdeviceptr s = 0;
  CHECK_CU(A->mem_alloc(&s, 512));
  CHECK(r != s);
  CHECK_CU(A->mem_free(r));
  CHECK_CU(A->mem_free(s));
  return 0;
}

static void* cache_and_exit(void* arg) {
  int* ok = arg;
  CUdeviceptr p[16];
  *ok = A->ctx_set_current(g_ctx) == CUDA_SUCCESS;
  for (int i = 0; i < 16 && *ok; ++i) *ok = A->mem_alloc(&p[i], 4096) == CUDA_SUCCESS;
  for (int i = 0; i < 16 && *ok; ++i) *ok = A->mem_free(p[i]) == CUDA_SUCCESS;
  return NULL;
}

/* A thread that exits with blocks in its cache gives them back: after it,
 * cachalloc_empty_cache returns every segment to the driver. */
static int tc_thread_exit_flush(void) {
  empty_cache_fn ec = empty_cache();
  CHECK(ec != NULL);
  int ok = 0;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, cache_and_exit, &ok) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(ok);
  CHECK(stats().live_allocs > 0);
  CHECK(ec(0) == 0);
  CHECK(stats().live_allocs == 0);
  return 0;
}

/* cachalloc_empty_cache flushes the calling thread's cache too. */
static int tc_empty_cache_flush(void) {
  empty_cache_fn ec = empty_cache();
  CHECK(ec != NULL);
  CUdeviceptr p = 0;
  CHECK_CU(A->mem_alloc(&p, 512));
  CHECK_CU(A->mem_free(p));
  CHECK(stats().live_allocs == 1);
  CHECK(ec(0) == 0);
  CHECK(stats().live_allocs == 0);
  CUdeviceptr q = 0;
  CHECK_CU(A->mem_alloc(&q, 512)); /* a new segment: nothing stale was kept */
  CHECK(stats().live_allocs == 1);
  CHECK_CU(A->mem_free(q));
  return 0;
}

enum { kChurnThreads = 8, kChurnLive = 16 };
static CUdeviceptr g_live[kChurnThreads][kChurnLive];

/* Each thread keeps a few small blocks live, frees some of its own, some of
 * its neighbour's (cross-thread), and writes a tag into each block's first
 * byte while it holds it (memset + copy back on the fake): a block handed to
 * two holders at once shows as a wrong tag. */
static void* churn_tc(void* arg) {
  const int id = (int)(intptr_t)arg;
  unsigned seed = 12345u + (unsigned)id;
  if (A->ctx_set_current(g_ctx) != CUDA_SUCCESS) return (void*)1;
  for (int i = 0; i < 4000; ++i) {
    const int k = (int)(rand_r(&seed) % kChurnLive);
    CUdeviceptr* slot = &g_live[id][k];
    if (*slot != 0) {
      unsigned char tag = 0;
      if (A->memcpy_dtoh(&tag, *slot, 1) != CUDA_SUCCESS || tag != (unsigned char)(id * 16 + k)) return (void*)1;
      if (A->mem_free(*slot) != CUDA_SUCCESS) return (void*)1;
      *slot = 0;
    } else {
      const size_t size = 1 + rand_r(&seed) % 8192;
      if (A->mem_alloc(slot, size) != CUDA_SUCCESS) return (void*)1;
      if (A->memset_d8(*slot, (unsigned char)(id * 16 + k), 1) != CUDA_SUCCESS) return (void*)1;
    }
  }
  return NULL;
}

static int tc_threads_churn(void) {
  pthread_t t[kChurnThreads];
  for (int i = 0; i < kChurnThreads; ++i) CHECK(pthread_create(&t[i], NULL, churn_tc, (void*)(intptr_t)i) == 0);
  for (int i = 0; i < kChurnThreads; ++i) {
    void* r = NULL;
    CHECK(pthread_join(t[i], &r) == 0);
    CHECK(r == NULL);
  }
  /* The rest, freed by the main thread (cross-thread for every block). */
  for (int i = 0; i < kChurnThreads; ++i)
    for (int k = 0; k < kChurnLive; ++k)
      if (g_live[i][k] != 0) CHECK_CU(A->mem_free(g_live[i][k]));
  empty_cache_fn ec = empty_cache();
  CHECK(ec != NULL && ec(0) == 0);
  CHECK(stats().live_allocs == 0);
  CHECK(stats().mem_free_invalid == 0);
  return 0;
}

/* Blocks a thread's cache handed out in context c1, freed while another
 * context is current (the shim's cuMemFree tries the cache of the thread's
 * last-used context before asking the driver which one is current): freed
 * in c1 and reused there.  With a non-blocking stream of c1 alive (the
 * fence rule) the batch's fence is recorded, and the blocks wait for c1's
 * busy stream: none is handed out again before it completes. */
static int tc_free_other_context(void) {
  ctx_create_fn create = (ctx_create_fn)A->fake_raw("cuCtxCreate_v2");
  enum { kBatch = 64 };
  CUcontext c1, c2;
  CUstream n;
  CUdeviceptr p = 0, q = 0, r = 0, base = 0, b[kBatch], c[kBatch];
  size_t size = 0;
  CHECK(create != NULL);
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(create(&c2, 0, 0));
  /* Stream rule: c1 is the thread's last context when c2 becomes current. */
  CHECK_CU(A->ctx_set_current(c1));
  CHECK_CU(A->mem_alloc(&p, 512));
  CHECK_CU(A->mem_free(p)); /* into c1's cache */
  CHECK_CU(A->mem_alloc(&q, 512));
  CHECK(q == p);
  CHECK_CU(A->ctx_set_current(c2));
  CHECK_CU(A->mem_free(q));
  CHECK(A->get_address_range(&base, &size, q) != CUDA_SUCCESS);
  CHECK(A->mem_free(q) != CUDA_SUCCESS); /* freed: a second free fails */
  CHECK_CU(A->ctx_set_current(c1));
  CHECK_CU(A->mem_alloc(&r, 512));
  CHECK(r == p); /* back in c1's cache */
  CHECK_CU(A->mem_free(r));
  /* Fence rule: a batch of blocks out of c1's cache, freed with c2 current. */
  for (int i = 0; i < kBatch; ++i) CHECK_CU(A->mem_alloc(&b[i], 512));
  for (int i = 0; i < kBatch; ++i) CHECK_CU(A->mem_free(b[i])); /* adopted by the cache */
  CHECK_CU(A->stream_create(&n, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < kBatch; ++i) CHECK_CU(A->mem_alloc(&b[i], 512));
  A->fake_hold(n, 1); /* c1's non-blocking stream is busy: fences wait for it */
  const unsigned long records = stats().event_record;
  CHECK_CU(A->ctx_set_current(c2));
  for (int i = 0; i < kBatch; ++i) CHECK_CU(A->mem_free(b[i]));
  /* The cache records its batch's fence at the free that fills it (the
   * core, caches off, only when a miss needs the blocks). */
  const char* conf = getenv("CACHALLOC_CONF");
  const int caches_on = conf == NULL || strstr(conf, "thread_cache_kb:0") == NULL;
  CHECK(!caches_on || stats().event_record > records);
  CHECK_CU(A->ctx_set_current(c1));
  for (int i = 0; i < kBatch; ++i) {
    CHECK_CU(A->mem_alloc(&c[i], 512));
    for (int j = 0; j < kBatch; ++j) CHECK(c[i] != b[j]);
  }
  CHECK(stats().dead_context_calls == 0);
  A->fake_hold(n, 0);
  for (int i = 0; i < kBatch; ++i) CHECK_CU(A->mem_free(c[i]));
  CHECK_CU(A->stream_destroy(n));
  CHECK_CU(A->ctx_set_current(g_ctx));
  return 0;
}

static const struct {
  const char* name;
  behaviour_fn run;
} cases[] = {
  {"tc_freed_queries", tc_freed_queries},
  {"tc_cross_thread_free", tc_cross_thread_free},
  {"tc_thread_exit_flush", tc_thread_exit_flush},
  {"tc_empty_cache_flush", tc_empty_cache_flush},
  {"tc_threads_churn", tc_threads_churn},
  {"tc_free_other_context", tc_free_other_context},
};

behaviour_fn thread_cache_behaviour(const char* name) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
    if (strcmp(cases[i].name, name) == 0) return cases[i].run;
  return NULL;
}
