/* route_behaviours.c — the semantic rules every route must show under the shim.
 *
 * Each behaviour drives the driver API through the route's function
 * pointers and reads the fake driver's counters to tell what reached the
 * driver: a served allocation does not reach cuMemAlloc_v2 of the fake, a
 * pass-through does.  Streams held busy (fake_cuda_hold_stream) stand in for
 * kernels still running, which is how the fence rules are observed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "route_common.h"

#define MiB ((size_t)1 << 20)

const char* g_route = "?";
const struct cuda_api* A;
CUcontext g_ctx; /* device 0's primary context */

struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  A->fake_stats(&s);
  return s;
}

/* A number the preloaded shim counted: "<key>": in cachalloc_stats_json
 * (its first occurrence: the only device these behaviours use), or -1. */
static long long shim_stat(const char* key) {
  static char json[1 << 17];
  int (*stats_json)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_stats_json");
  if (stats_json == NULL || stats_json(json, sizeof json) != 0) return -1;
  char pattern[128];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char* at = strstr(json, pattern);
  return at == NULL ? -1 : strtoll(at + strlen(pattern), NULL, 10);
}

/* cuInit, device 0, its primary context made current. */
static int setup(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(A->init(0));
  CHECK_CU(A->device_get(&dev, 0));
  CHECK_CU(A->primary_ctx_retain(&ctx, dev));
  CHECK_CU(A->ctx_set_current(ctx));
  g_ctx = ctx;
  return 0;
}

/* A malloc/free/malloc of one size reaches the driver once: the cache served it. */
static int served(void) {
  CUdeviceptr p = 0, q = 0;
  unsigned long before = stats().mem_alloc;
  CHECK_CU(A->mem_alloc(&p, 1000));
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_alloc(&q, 1000));
  CHECK(q == p);
  CHECK(stats().mem_alloc == before + 1);
  CHECK(stats().mem_free == 0);
  /* The memory is usable. */
  unsigned char buf[1000];
  CHECK_CU(A->memset_d8(q, 0x5a, sizeof buf));
  CHECK_CU(A->memcpy_dtoh(buf, q, sizeof buf));
  CHECK(buf[0] == 0x5a && buf[999] == 0x5a);
  CHECK_CU(A->mem_free(q));
  return 0;
}

/* The functions the route handed out are cachalloc's, not the driver's. */
static int intercepted(void) {
  CHECK((void*)A->mem_alloc != A->fake_raw("cuMemAlloc_v2"));
  CHECK((void*)A->mem_free != A->fake_raw("cuMemFree_v2"));
  CHECK((void*)A->mem_alloc_async != A->fake_raw("cuMemAllocAsync"));
  CHECK((void*)A->mem_free_async != A->fake_raw("cuMemFreeAsync"));
  CHECK((void*)A->mem_alloc_async_ptsz != A->fake_raw("cuMemAllocAsync_ptsz"));
  CHECK((void*)A->mem_free_async_ptsz != A->fake_raw("cuMemFreeAsync_ptsz"));
  CHECK((void*)A->mem_get_info != A->fake_raw("cuMemGetInfo_v2"));
  CHECK((void*)A->stream_create != A->fake_raw("cuStreamCreate"));
  CHECK((void*)A->begin_capture != A->fake_raw("cuStreamBeginCapture_v2"));
  /* The per-thread variants are distinct wrappers. */
  CHECK((void*)A->mem_alloc_async_ptsz != (void*)A->mem_alloc_async);
  CHECK((void*)A->mem_free_async_ptsz != (void*)A->mem_free_async);
  return served();
}

static int free_null(void) {
  CHECK_CU(A->mem_free(0));
  CHECK(stats().mem_free_invalid == 0);
  return 0;
}

static int zero_size(void) {
  CUdeviceptr p = 0;
  CHECK(A->mem_alloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  return 0;
}

/* Double free and interior pointers are refused and change nothing. */
static int double_free(void) {
  CUdeviceptr p = 0, q = 0, r = 0;
  CHECK_CU(A->mem_alloc(&p, 4096));
  CHECK_CU(A->mem_alloc(&q, 4096));
  CHECK_CU(A->mem_free(p));
  CHECK(A->mem_free(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(A->mem_free(q + 512) == CUDA_ERROR_INVALID_VALUE);
  struct fake_cuda_stats_t s = stats();
  CHECK(s.mem_free == 0 && s.mem_free_invalid == 0); /* nothing reached the driver */
  CHECK_CU(A->mem_free(q));                           /* q is still live */
  CHECK_CU(A->mem_alloc(&r, 4096));                   /* and the cache still serves */
  CHECK(r == p || r == q);
  CHECK(stats().mem_alloc == s.mem_alloc);
  CHECK_CU(A->mem_free(r));
  return 0;
}

/* Blocks are aligned to 512 B and never overlap. */
static int alignment(void) {
  enum { N = 64 };
  CUdeviceptr p[N];
  size_t size[N];
  for (int i = 0; i < N; ++i) {
    size[i] = 1 + (size_t)i * 7919 % (3 * MiB);
    CHECK_CU(A->mem_alloc(&p[i], size[i]));
    CHECK(p[i] % 512 == 0);
  }
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j)
      if (i != j) CHECK(p[i] + size[i] <= p[j] || p[j] + size[j] <= p[i]);
  for (int i = 0; i < N; ++i) CHECK_CU(A->mem_free(p[i]));
  return 0;
}

/* The free rule with several streams (free_sync fence, and auto once a
 * second stream exists): a plain free makes no driver call; the block waits
 * for a fence — one event on the legacy stream plus one per live
 * non-blocking stream — recorded for a batch of frees when the cache misses.
 * check_fenced_reuse() frees p while `held` (a stream standing in for a
 * kernel still reading p) is busy, then churns: no block may be p until
 * something waited for its fence, at least one fence must have been recorded, no free
 * may have synchronized the context; once the stream is idle, p comes back
 * within one churn round. */
enum { kChurn = 64 };

static int check_fenced_reuse(CUstream held) {
  CUdeviceptr p = 0, b[kChurn], seen[2 * kChurn + 1];
  int distinct = 0;
  A->fake_hold(held, 1);
  CHECK_CU(A->mem_alloc(&p, MiB));
  seen[distinct++] = p;
  const unsigned long records = stats().event_record, syncs = stats().ctx_sync, waits = stats().event_sync,
                      joins = stats().ctx_wait_event;
  CHECK_CU(A->mem_free(p));
  CHECK(stats().event_record == records && stats().ctx_sync == syncs); /* nothing at the free */
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kChurn; ++i) {
      CHECK_CU(A->mem_alloc(&b[i], MiB));
      /* p comes back only after a wait for its fence (a miss waits rather
       * than grow while more bytes wait than are allocated; the fake's
       * cuEventSynchronize completes the held work, as waiting does), or
       * after a join orders all later work after it (cuCtxWaitEvent;
       * join_orders_later_work checks that order) */
      CHECK(b[i] != p || stats().event_sync > waits || stats().ctx_wait_event > joins);
      int known = 0;
      for (int k = 0; k < distinct; ++k) known |= seen[k] == b[i];
      if (!known) seen[distinct++] = b[i];
    }
    for (int i = 0; i < kChurn; ++i) CHECK_CU(A->mem_free(b[i]));
  }
  CHECK(stats().event_record > records); /* fences were recorded... */
  CHECK(stats().ctx_sync == syncs);      /* ...and nothing synchronized */
  A->fake_hold(held, 0);
  /* Everything freed so far is reusable now: as many allocations as there
   * were distinct blocks reach the driver no more, and one of them is p. */
  CUdeviceptr c[2 * kChurn + 1];
  const unsigned long device_allocs = stats().mem_alloc;
  int found = 0;
  for (int i = 0; i < distinct; ++i) {
    CHECK_CU(A->mem_alloc(&c[i], MiB));
    found |= c[i] == p;
  }
  CHECK(found);
  CHECK(stats().mem_alloc == device_allocs);
  for (int i = 0; i < distinct; ++i) CHECK_CU(A->mem_free(c[i]));
  return 0;
}

/* Two blocking streams, one busy with p: they are not ordered with each
 * other, so frees are fenced; the legacy stream's event waits for both. */
static int fence(void) {
  CUstream s, t;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->stream_create(&t, 0));
  CHECK(check_fenced_reuse(s) == 0);
  CHECK_CU(A->stream_destroy(s));
  CHECK_CU(A->stream_destroy(t));
  return 0;
}

/* With `held` busy, a freed block is the next one handed out, and nothing
 * was recorded, queried or synchronized: stream-order reuse. */
static int check_immediate_reuse(CUstream held) {
  CUdeviceptr p = 0, q = 0;
  A->fake_hold(held, 1);
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK(q == p);
  struct fake_cuda_stats_t st = stats();
  CHECK(st.event_record == 0 && st.ctx_sync == 0 && st.event_sync == 0);
  A->fake_hold(held, 0);
  CHECK_CU(A->mem_free(q));
  return 0;
}

/* One blocking stream besides the legacy one (cuBLASLt creates one in every
 * PyTorch program): the legacy stream's implicit synchronization orders the
 * two both ways, so all work runs in one sequence and a freed block is
 * reused at once, as with the legacy stream alone: no event, no sync. */
static int one_blocking_stream_serial(void) {
  CUstream s;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK(check_immediate_reuse(s) == 0);
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* The stream that ends the single sequence (here a non-blocking one after
 * a blocking one) may run the blocks reused at once before it while earlier
 * work still uses them: in the hook that creates it, it is made to wait on
 * the device for an event recorded on the legacy stream, and so is every
 * stream noted before that event completes.  The host is never
 * synchronized (work waiting on the host could hang it); later frees are
 * fenced. */
static int second_stream_waits(void) {
  CUstream s, n, m, late;
  CUevent e;
  CUdeviceptr p = 0;
  CHECK_CU(A->stream_create(&s, 0));
  for (int i = 0; i < 8; ++i) {
    CHECK_CU(A->mem_alloc(&p, MiB));
    CHECK_CU(A->mem_free(p));
  }
  A->fake_hold(s, 1); /* work enqueued before still runs on s */
  const unsigned long waits = stats().stream_wait_event;
  CHECK_CU(A->stream_create(&n, CU_STREAM_NON_BLOCKING));
  CHECK(stats().stream_wait_event == waits + 1);
  CHECK_CU(A->event_create(&e, 0));
  CHECK_CU(A->event_record(e, n));
  CHECK(A->event_query(e) == CUDA_ERROR_NOT_READY); /* n's work runs after s's */
  CHECK_CU(A->stream_create(&m, 0));
  CHECK(stats().stream_wait_event == waits + 2); /* so does a stream created meanwhile */
  A->fake_hold(s, 0);
  CHECK_CU(A->event_query(e));
  CHECK_CU(A->stream_create(&late, 0));
  CHECK(stats().stream_wait_event == waits + 2); /* the event completed: nothing more to wait for */
  CHECK(check_fenced_reuse(n) == 0);             /* fenced now */
  CHECK(stats().ctx_sync == 0);                  /* and the host never waited */
  CHECK_CU(A->stream_destroy(s));
  CHECK_CU(A->stream_destroy(n));
  CHECK_CU(A->stream_destroy(m));
  CHECK_CU(A->stream_destroy(late));
  return 0;
}

/* Work on the legacy stream may still read a freed block while the next
 * owner writes it from a non-blocking stream (which does not wait for the
 * legacy stream): the fence covers the legacy stream too. */
static int fence_legacy_reader(void) {
  CUstream s, t;
  CHECK_CU(A->stream_create(&s, 0)); /* two blocking streams: frees are fenced */
  CHECK_CU(A->stream_create(&t, 0));
  CHECK(check_fenced_reuse(NULL) == 0);
  return 0;
}

/* Several blocking streams, one busy: still one event per fence, on the
 * legacy stream. */
static int fence_blocking_stream(void) {
  CUstream s, t;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->stream_create(&t, 0));
  const unsigned long records = stats().event_record;
  CHECK(check_fenced_reuse(t) == 0);
  const unsigned long fence_events = stats().event_record - records;
  CHECK(fence_events >= 1 && fence_events <= 3 * kChurn / 20); /* batched: at most ~1 per 20 frees */
  return 0;
}

/* Work on a non-blocking stream is not ordered by the legacy stream: the
 * fence records one event on it too — no context synchronization, ever. */
static int nonblocking_stream_fenced(void) {
  CUstream s;
  CHECK_CU(A->stream_create(&s, CU_STREAM_NON_BLOCKING));
  CHECK(check_fenced_reuse(s) == 0);
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* PyTorch keeps ~128 non-blocking streams alive and runs work on one or two:
 * a fence asks each stream whether it is idle and records events only on
 * the legacy stream and the busy ones; reuse stays as safe as before. */
static int idle_streams_skipped(void) {
  enum { kIdle = 32 };
  CUstream idle[kIdle], busy;
  for (int i = 0; i < kIdle; ++i) CHECK_CU(A->stream_create(&idle[i], CU_STREAM_NON_BLOCKING));
  CHECK_CU(A->stream_create(&busy, CU_STREAM_NON_BLOCKING));
  const unsigned long records = stats().event_record, queries = stats().stream_query;
  const long long counted = shim_stat("num_fence_stream_queries");
  CHECK(counted >= 0);
  CHECK(check_fenced_reuse(busy) == 0);
  const unsigned long recorded = stats().event_record - records, asked = stats().stream_query - queries;
  CHECK(asked >= kIdle + 1);             /* every non-blocking stream was asked... */
  CHECK(recorded >= 2);                  /* ...the legacy and the busy one got events... */
  CHECK(recorded * (kIdle / 4) <= asked); /* ...and the idle ones none (2 per 33 queries) */
  /* The fences made every query the driver answered (nothing else queries a
   * stream here), and the statistics count each one. */
  CHECK(shim_stat("num_fence_stream_queries") - counted == (long long)asked);
  for (int i = 0; i < kIdle; ++i) CHECK_CU(A->stream_destroy(idle[i]));
  CHECK_CU(A->stream_destroy(busy));
  return 0;
}

/* Threads create and destroy non-blocking streams while this thread frees
 * and allocates, recording fences on whatever streams are live: the destroy
 * hook and the fence take one lock, so no event is ever recorded on a
 * destroyed stream (on a real GPU that crashes inside libcuda). */
static int g_stop_streams; /* atomic: the flicker threads read it while this thread sets it */

static void* stream_flicker(void* ok) {
  int good = A->ctx_set_current(g_ctx) == CUDA_SUCCESS;
  while (good && !__atomic_load_n(&g_stop_streams, __ATOMIC_RELAXED)) {
    CUstream s;
    good = A->stream_create(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS && A->stream_destroy(s) == CUDA_SUCCESS;
  }
  *(int*)ok = good;
  return NULL;
}

static int stream_destroyed_during_fence(void) {
  enum { kThreads = 4 };
  pthread_t t[kThreads];
  int ok[kThreads];
  CUstream keep;
  CHECK_CU(A->stream_create(&keep, CU_STREAM_NON_BLOCKING));
  __atomic_store_n(&g_stop_streams, 0, __ATOMIC_RELAXED);
  for (int i = 0; i < kThreads; ++i) CHECK(pthread_create(&t[i], NULL, stream_flicker, &ok[i]) == 0);
  CUdeviceptr b[kChurn];
  const unsigned long records = stats().event_record;
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i < kChurn; ++i) CHECK_CU(A->mem_alloc(&b[i], (size_t)(1 + i % 7) * MiB));
    for (int i = 0; i < kChurn; ++i) CHECK_CU(A->mem_free(b[i]));
  }
  __atomic_store_n(&g_stop_streams, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < kThreads; ++i) {
    CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(ok[i]);
  }
  CHECK(stats().event_record > records);
  CHECK(stats().record_on_dead_stream == 0);
  CHECK_CU(A->stream_destroy(keep));
  return 0;
}

/* A program using only the legacy stream pays nothing: stream-ordered reuse,
 * no event, no synchronization. */
static int legacy_only(void) { return check_immediate_reuse(NULL); }

/* free_sync:stream reuses at once even with another stream busy. */
static int policy_stream(void) {
  CUstream s;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->stream_create(&s, 0));
  A->fake_hold(s, 1);
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK(q == p);
  CHECK(stats().event_record == 0);
  A->fake_hold(s, 0);
  CHECK_CU(A->mem_free(q));
  return 0;
}

/* free_sync:device synchronizes the context on each free, then reuses (as
 * auto does under compute-sanitizer once two streams are not ordered). */
static int policy_device(void) {
  CUstream s, t;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->stream_create(&t, 0));
  A->fake_hold(s, 1);
  unsigned long syncs = stats().ctx_sync;
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->mem_free(p));
  CHECK(stats().ctx_sync == syncs + 1);
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK(q == p);
  A->fake_hold(s, 0);
  CHECK_CU(A->mem_free(q));
  return 0;
}

/* cuMemAllocAsync/cuMemFreeAsync on one stream: reuse at once, even while
 * the stream is busy (stream order protects it). */
static int async_same_stream(void) {
  CUstream s;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->stream_create(&s, 0));
  A->fake_hold(s, 1);
  CHECK_CU(A->mem_alloc_async(&p, MiB, s));
  CHECK_CU(A->mem_free_async(p, s));
  CHECK_CU(A->mem_alloc_async(&q, MiB, s));
  CHECK(q == p);
  struct fake_cuda_stats_t st = stats();
  CHECK(st.mem_alloc_async == 0 && st.mem_alloc == 1); /* one segment, from the cache */
  A->fake_hold(s, 0);
  CHECK_CU(A->mem_free_async(q, s));
  return 0;
}

/* Freed on another stream: reusable only after the free's event. */
static int async_other_stream(void) {
  CUstream s1, s2;
  CUdeviceptr p = 0, q = 0, r = 0;
  CHECK_CU(A->stream_create(&s1, 0));
  CHECK_CU(A->stream_create(&s2, 0));
  A->fake_hold(s2, 1);
  CHECK_CU(A->mem_alloc_async(&p, MiB, s1));
  CHECK_CU(A->mem_free_async(p, s2));
  CHECK_CU(A->mem_alloc_async(&q, MiB, s1));
  CHECK(q != p);
  A->fake_hold(s2, 0);
  CHECK_CU(A->mem_alloc_async(&r, MiB, s1));
  CHECK(r == p);
  CHECK_CU(A->mem_free_async(q, s1));
  CHECK_CU(A->mem_free_async(r, s1));
  return 0;
}

/* A thread with no current context allocates on a stream another thread
 * created: cudart makes no context current for calls that carry a stream,
 * and the driver serves them in the stream's context.  So does the cache:
 * served there (no driver pool allocation, the block reused in stream
 * order), the stream's context current during the call only. */
struct no_context_run {
  CUstream s;
  CUdeviceptr p, q;
  int ok, fast;
};

static int no_current_context(void) {
  PFN_cuCtxGetCurrent_v4000 get = (PFN_cuCtxGetCurrent_v4000)A->fake_raw("cuCtxGetCurrent");
  CUcontext cur = (CUcontext)1;
  return get != NULL && get(&cur) == CUDA_SUCCESS && cur == NULL;
}

static void* async_in_thread_without_context(void* arg) {
  struct no_context_run* r = arg;
  CUdeviceptr small = 0, again = 0;
  r->ok = no_current_context();
  r->ok &= A->mem_alloc_async(&r->p, MiB, r->s) == CUDA_SUCCESS;
  r->ok &= A->mem_free_async(r->p, r->s) == CUDA_SUCCESS;
  r->ok &= A->mem_alloc_async(&r->q, MiB, r->s) == CUDA_SUCCESS;
  r->ok &= no_current_context(); /* the thread's own (none) restored */
  /* Small pairs: once the thread's front cache holds the block, served with
   * no context made current at all (no driver call). */
  r->ok &= A->mem_alloc_async(&small, 512, r->s) == CUDA_SUCCESS && A->mem_free_async(small, r->s) == CUDA_SUCCESS;
  const unsigned long switches = stats().ctx_set_current;
  for (int i = 0; i < 100; ++i) {
    r->ok &= A->mem_alloc_async(&again, 512, r->s) == CUDA_SUCCESS && again == small;
    r->ok &= A->mem_free_async(again, r->s) == CUDA_SUCCESS;
  }
  r->fast = stats().ctx_set_current == switches;
  r->ok &= no_current_context();
  return NULL;
}

static int async_no_current_context(void) {
  struct no_context_run r = {0};
  pthread_t t;
  CUdeviceptr again = 0;
  CHECK_CU(A->stream_create(&r.s, 0));
  CHECK(pthread_create(&t, NULL, async_in_thread_without_context, &r) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(r.ok);
  CHECK(r.fast);
  CHECK(r.q == r.p);
  struct fake_cuda_stats_t st = stats();
  CHECK(st.mem_alloc_async == 0 && st.mem_alloc == 1); /* the cache's segment, not the driver's pool */
  /* The block is the stream's context's: freed and reused here, where that context is current. */
  CHECK_CU(A->mem_free_async(r.q, r.s));
  CHECK_CU(A->mem_alloc_async(&again, MiB, r.s));
  CHECK(again == r.p);
  CHECK(stats().mem_alloc == 1 && stats().mem_free_async == 0);
  CHECK_CU(A->mem_free_async(again, r.s));
  CHECK_CU(A->stream_destroy(r.s));
  return 0;
}

/* The per-thread default stream through the _ptsz entry points. */
static int async_ptsz(void) {
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->mem_alloc_async_ptsz(&p, MiB, NULL));
  CHECK_CU(A->mem_free_async_ptsz(p, NULL));
  CHECK_CU(A->mem_alloc_async_ptsz(&q, MiB, NULL));
  CHECK(q == p);
  struct fake_cuda_stats_t st = stats();
  CHECK(st.mem_alloc_async == 0 && st.mem_alloc_async_ptsz == 0 && st.mem_alloc == 1);
  CHECK_CU(A->mem_free_async_ptsz(q, CU_STREAM_PER_THREAD));
  return 0;
}

/* This thread's per-thread default stream is a blocking stream: the
 * legacy stream's event covers it. */
static int ptsz_fence(void) {
  CUdeviceptr a = 0;
  CUstream s;
  CHECK_CU(A->mem_alloc_async_ptsz(&a, 4096, NULL)); /* the per-thread stream is now in use, */
  CHECK_CU(A->stream_create(&s, 0));                  /* and another blocking stream */
  CHECK(check_fenced_reuse(CU_STREAM_PER_THREAD) == 0);
  return 0;
}

static void* use_ptsz_in_thread(void* ok) {
  CUdeviceptr p = 0;
  *(int*)ok = A->ctx_set_current(g_ctx) == CUDA_SUCCESS && A->mem_alloc_async_ptsz(&p, 4096, NULL) == CUDA_SUCCESS &&
              A->mem_free_async_ptsz(p, NULL) == CUDA_SUCCESS;
  return NULL;
}

/* Per-thread default streams of other threads are blocking streams: the one
 * event on the legacy stream covers them, no context synchronization, and a
 * free makes no driver call. */
static int ptsz_threads(void) {
  CUdeviceptr a = 0, p = 0;
  int ok = 0;
  pthread_t t;
  CHECK_CU(A->mem_alloc_async_ptsz(&a, 4096, NULL));
  CHECK(pthread_create(&t, NULL, use_ptsz_in_thread, &ok) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(ok);
  unsigned long syncs = stats().ctx_sync, records = stats().event_record;
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->mem_free(p));
  CHECK(stats().ctx_sync == syncs);
  CHECK(stats().event_record == records);
  CHECK(check_fenced_reuse(NULL) == 0);
  return 0;
}

/* A blocking stream here, and another thread's per-thread stream: two
 * blocking streams, not ordered with each other, fenced by the one event on
 * the legacy stream. */
static int ptsz_other_thread(void) {
  int ok = 0;
  pthread_t t;
  CUstream s;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK(pthread_create(&t, NULL, use_ptsz_in_thread, &ok) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(ok);
  const unsigned long syncs = stats().ctx_sync;
  CHECK(check_fenced_reuse(NULL) == 0);
  CHECK(stats().ctx_sync == syncs);
  return 0;
}

/* Many threads allocate, write, check and free at once through the shim:
 * every block holds its owner's pattern until freed (no block handed out
 * twice), and the cache ends with nothing live. */
struct worker { int id; int ok; };

static void* churn(void* arg) {
  struct worker* w = arg;
  enum { LIVE = 16, ROUNDS = 400 };
  CUdeviceptr p[LIVE] = {0};
  size_t n[LIVE] = {0};
  unsigned seed = 12345u + (unsigned)w->id;
  unsigned char buf[64];
  w->ok = A->ctx_set_current(g_ctx) == CUDA_SUCCESS;
  for (int r = 0; r < ROUNDS && w->ok; ++r) {
    int i = (int)(rand_r(&seed) % LIVE);
    if (p[i] != 0) {
      A->memcpy_dtoh(buf, p[i], sizeof buf);
      for (size_t k = 0; k < sizeof buf; ++k) w->ok &= buf[k] == (unsigned char)(w->id * 16 + i);
      w->ok &= A->mem_free(p[i]) == CUDA_SUCCESS;
      p[i] = 0;
    } else {
      n[i] = 64 + rand_r(&seed) % (4 * MiB);
      w->ok &= A->mem_alloc(&p[i], n[i]) == CUDA_SUCCESS;
      if (w->ok) A->memset_d8(p[i], (unsigned char)(w->id * 16 + i), n[i]);
    }
  }
  for (int i = 0; i < LIVE; ++i)
    if (p[i] != 0) w->ok &= A->mem_free(p[i]) == CUDA_SUCCESS;
  return NULL;
}

static int threads(void) {
  enum { T = 8 };
  pthread_t t[T];
  struct worker w[T];
  for (int i = 0; i < T; ++i) {
    w[i].id = i;
    CHECK(pthread_create(&t[i], NULL, churn, &w[i]) == 0);
  }
  for (int i = 0; i < T; ++i) CHECK(pthread_join(t[i], NULL) == 0);
  for (int i = 0; i < T; ++i) CHECK(w[i].ok);
  CHECK(stats().mem_free_invalid == 0);
  return 0;
}

/* During capture the allocation and its free go to the driver untouched. */
static int capture(void) {
  CUstream s;
  CUgraph g;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(A->mem_alloc_async(&p, MiB, s));
  CHECK(stats().mem_alloc_async == 1);
  CHECK_CU(A->mem_free_async(p, s));
  CHECK(stats().mem_free_async == 1);
  CHECK_CU(A->end_capture(s, &g));
  CHECK_CU(A->mem_alloc_async(&q, MiB, s)); /* after the capture: the cache again */
  CHECK(stats().mem_alloc_async == 1);
  CHECK_CU(A->mem_free_async(q, s));
  return 0;
}

/* During a global-mode capture the cache must not query events (an unsafe
 * call that would invalidate the capture): pending frees wait for its end.
 * The cache is warm (growing it takes a cuMemAlloc, which the capture
 * forbids), and p, allocated and freed during the capture, is the graph's
 * until the graph is destroyed. */
static int capture_global(void) {
  CUstream s1, s2, s3;
  CUgraph g;
  CUdeviceptr p = 0, q = 0, r = 0, w[2];
  CUresult (*graph_destroy)(CUgraph) = (CUresult(*)(CUgraph))A->entry("cuGraphDestroy", 10000, 0, "cuGraphDestroy");
  CHECK(graph_destroy != NULL);
  CHECK_CU(A->stream_create(&s1, 0));
  CHECK_CU(A->stream_create(&s2, 0));
  CHECK_CU(A->stream_create(&s3, 0));
  for (int i = 0; i < 2; ++i) CHECK_CU(A->mem_alloc_async(&w[i], MiB, s2));
  for (int i = 0; i < 2; ++i) CHECK_CU(A->mem_free_async(w[i], s2));
  CHECK_CU(A->begin_capture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(A->mem_alloc_async(&p, MiB, s2));
  CHECK_CU(A->mem_free_async(p, s3)); /* waits for an event on s3 */
  unsigned long queries = stats().event_query;
  CHECK_CU(A->mem_alloc_async(&q, MiB, s2));
  CHECK(stats().event_query == queries);
  CHECK(q != p);
  CHECK_CU(A->end_capture(s1, &g));
  CHECK_CU(A->mem_alloc_async(&r, MiB, s2)); /* p is the graph's */
  CHECK(r != p);
  CHECK_CU(A->mem_free_async(r, s2));
  CHECK_CU(graph_destroy(g));
  CHECK_CU(A->mem_alloc_async(&r, MiB, s2)); /* the graph is gone: p is back, events queried now */
  CHECK(stats().event_query > queries);
  CHECK(r == p);
  return 0;
}

/* A free during a capture records nothing (an event on the legacy stream
 * would break the capture) and synchronizes nothing: the block waits for a
 * fence, which is recorded only once the capture has ended. */
static int fence_during_capture(void) {
  CUstream s1, s2;
  CUgraph g;
  CUdeviceptr p = 0, q = 0, b[kChurn];
  CHECK_CU(A->stream_create(&s1, 0));
  CHECK_CU(A->stream_create(&s2, 0));
  CHECK_CU(A->begin_capture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(A->mem_alloc(&p, MiB));
  const unsigned long records = stats().event_record, syncs = stats().ctx_sync;
  CHECK_CU(A->mem_free(p));
  CHECK(A->mem_free(p) == CUDA_ERROR_INVALID_VALUE); /* a double free is still caught */
  for (int round = 0; round < 2; ++round) {         /* misses during the capture: no fence */
    for (int i = 0; i < kChurn; ++i) {
      CHECK_CU(A->mem_alloc(&b[i], MiB));
      CHECK(b[i] != p);
    }
    for (int i = 0; i < kChurn; ++i) CHECK_CU(A->mem_free(b[i]));
  }
  CHECK(stats().event_record == records && stats().ctx_sync == syncs);
  CHECK_CU(A->end_capture(s1, &g));
  /* What the capture freed is its graph's until the graph is gone. */
  CUresult (*graph_destroy)(CUgraph) = (CUresult(*)(CUgraph))A->entry("cuGraphDestroy", 10000, 0, "cuGraphDestroy");
  CHECK(graph_destroy != NULL);
  CHECK_CU(graph_destroy(g));
  CUdeviceptr c[2 * kChurn + 1];
  int found = 0;
  for (int i = 0; i < 2 * kChurn + 1; ++i) {
    CHECK_CU(A->mem_alloc(&c[i], MiB));
    found |= c[i] == p;
  }
  CHECK(found); /* the first miss after the capture fenced and reclaimed p */
  CHECK(stats().event_record > records);
  for (int i = 0; i < 2 * kChurn + 1; ++i) CHECK_CU(A->mem_free(c[i]));
  (void)q;
  return 0;
}

/* expandable_segments:true through the real backend's VM calls: pages are
 * created and mapped on demand (no cuMemAlloc_v2 reaches the driver), data
 * written through the mapping reads back, and a freed block grows in place. */
static int expandable(void) {
  CUdeviceptr p = 0, q = 0;
  unsigned char buf[4096];
  CHECK_CU(A->mem_alloc(&p, 30 * MiB));
  CHECK_CU(A->memset_d8(p, 0x5a, 30 * MiB));
  CHECK_CU(A->memcpy_dtoh(buf, p + 30 * MiB - sizeof buf, sizeof buf));
  for (size_t i = 0; i < sizeof buf; ++i) CHECK(buf[i] == 0x5a);
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_alloc(&q, 50 * MiB));
  CHECK(q == p); /* the 40 MiB free block grew by one 20 MiB page */
  CHECK_CU(A->memset_d8(q + 45 * MiB, 0x33, MiB));
  CHECK_CU(A->memcpy_dtoh(buf, q + 45 * MiB, sizeof buf));
  CHECK(buf[0] == 0x33 && buf[sizeof buf - 1] == 0x33);
  struct fake_cuda_stats_t s = stats();
  CHECK(s.mem_alloc == 0);
  CHECK(s.vm_reserve >= 1 && s.vm_create == 2 && s.vm_map == 2); /* a run of two pages, then one page */
  CHECK(s.set_access == 2);                                         /* one grant per grow */
  CHECK_CU(A->mem_free(q));
  return 0;
}

/* A new non-blocking stream *s, and 40 MiB allocated there (*p) and freed
 * there while a held kernel on *s still writes it (fake_hold(*s, 0) ends it). */
static int free_under_kernel(CUstream* s, CUdeviceptr* p) {
  CHECK_CU(A->stream_create(s, CU_STREAM_NON_BLOCKING));
  CHECK_CU(A->mem_alloc_async(p, 40 * MiB, *s));
  A->fake_hold(*s, 1);
  CHECK_CU(A->launch_kernel(NULL, 1, 1, 1, 1, 1, 1, 0, *s, NULL, NULL));
  CHECK_CU(A->mem_free_async(*p, *s));
  return 0;
}

/* A block freed on its stream while a kernel there still uses it: the
 * out-of-memory path gives its pages back only once the device is
 * synchronized, because cuMemUnmap does not wait as cuMemFree does. */
static int expandable_unmap_waits(void) {
  CUstream s;
  CUdeviceptr p = 0, q = 0;
  if (free_under_kernel(&s, &p)) return 1;
  const struct fake_cuda_stats_t s0 = stats();
  /* More than the device has: cached pages go back before the refusal. */
  CHECK(A->mem_alloc(&q, (size_t)1 << 40) == CUDA_ERROR_OUT_OF_MEMORY);
  const struct fake_cuda_stats_t s1 = stats();
  CHECK(s1.vm_unmap > s0.vm_unmap);
  CHECK(s1.vm_unmap_in_flight == 0);
  CHECK(s1.ctx_sync > s0.ctx_sync);
  A->fake_hold(s, 0);
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* release_remap: a block freed on stream s while a kernel there still uses
 * it; a new peak on stream t takes its run with no synchronization and no
 * new physical memory (the run is mapped again at t's address, after a
 * context-wide fence that t's work then waits for), and the old address
 * is unmapped only once the fence shows the kernel done.  Run with
 * expandable_segments, release_before_peak and release_remap on. */
static int expandable_remap(void) {
  CUstream s, t;
  CUdeviceptr p = 0, q = 0, r = 0;
  unsigned char buf[4096];
  if (free_under_kernel(&s, &p)) return 1;
  CHECK_CU(A->stream_create(&t, CU_STREAM_NON_BLOCKING));
  const struct fake_cuda_stats_t s0 = stats();
  CHECK_CU(A->mem_alloc_async(&q, 40 * MiB, t));
  const struct fake_cuda_stats_t s1 = stats();
  CHECK(q != p);
  CHECK(s1.ctx_sync == s0.ctx_sync && s1.stream_sync == s0.stream_sync); /* no host wait */
  CHECK(s1.vm_create == s0.vm_create);                                  /* p's memory */
  CHECK(s1.vm_unmap == s0.vm_unmap && s1.vm_unmap_in_flight == 0);      /* p's address stays */
  CHECK(s1.ctx_wait_event == s0.ctx_wait_event + 1);                    /* t's work waits on device */
  CHECK_CU(A->memset_d8(q, 0x6b, 40 * MiB));
  CHECK_CU(A->memcpy_dtoh(buf, q + 40 * MiB - sizeof buf, sizeof buf));
  CHECK(buf[0] == 0x6b && buf[sizeof buf - 1] == 0x6b);
  CHECK_CU(A->mem_alloc(&r, 1024)); /* a grow polls the fence: not done, p's address stays */
  CHECK(stats().vm_unmap == s1.vm_unmap);
  A->fake_hold(s, 0); /* the kernel finishes */
  CHECK_CU(A->mem_free(r));
  CHECK_CU(A->mem_alloc(&r, 3 * MiB)); /* another small page: the fence is done, p's address goes */
  const struct fake_cuda_stats_t s2 = stats();
  /* p's old address goes, and r's free small page too: a 2 MiB run is no
   * whole number of the large pool's pages, so no run fits a remap and the
   * synchronizing path gives it back (one device sync) */
  CHECK(s2.vm_unmap == s1.vm_unmap + 2 && s2.vm_unmap_in_flight == 0);
  CHECK(s2.ctx_sync == s1.ctx_sync + 1);
  CHECK_CU(A->mem_free(r));
  CHECK_CU(A->mem_free_async(q, t));
  CHECK_CU(A->stream_destroy(t));
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* During a global-mode capture the out-of-memory path synchronizes nothing
 * (cuCtxSynchronize would invalidate the capture), so free pages stay
 * mapped; after it, they go back. */
static int expandable_release_during_capture(void) {
  CUstream s, c;
  CUgraph g;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(A->stream_create(&s, CU_STREAM_NON_BLOCKING));
  CHECK_CU(A->stream_create(&c, CU_STREAM_NON_BLOCKING));
  CHECK_CU(A->mem_alloc_async(&p, 40 * MiB, s));
  CHECK_CU(A->mem_free_async(p, s));
  CHECK_CU(A->begin_capture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  const struct fake_cuda_stats_t s0 = stats();
  CHECK(A->mem_alloc_async(&q, (size_t)1 << 40, s) == CUDA_ERROR_OUT_OF_MEMORY);
  const struct fake_cuda_stats_t s1 = stats();
  CHECK(s1.ctx_sync == s0.ctx_sync && s1.capture_invalidations == s0.capture_invalidations);
  CHECK(s1.vm_unmap == s0.vm_unmap);
  CHECK_CU(A->end_capture(c, &g));
  CHECK(A->mem_alloc_async(&q, (size_t)1 << 40, s) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(stats().vm_unmap > s1.vm_unmap);
  CHECK_CU(A->stream_destroy(c));
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* auto handle type: a driver that refuses shareable POSIX fd handles gets
 * plain ones (run with FAKE_CUDA_NO_POSIX_FD=1). */
static int expandable_plain_handles(void) {
  CUdeviceptr p = 0;
  CHECK_CU(A->mem_alloc(&p, 4 * MiB));
  struct fake_cuda_stats_t s = stats();
  CHECK(s.vm_create_refused == 1 && s.vm_create == 1);
  CHECK_CU(A->mem_free(p));
  return 0;
}

/* An explicit posix_fd handle type that the driver refuses is the driver's
 * error, not a silent fallback (run with FAKE_CUDA_NO_POSIX_FD=1). */
static int expandable_posix_fd_refused(void) {
  CUdeviceptr p = 0;
  CHECK(A->mem_alloc(&p, 4 * MiB) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(stats().vm_create == 0);
  return 0;
}

/* A pointer cachalloc never handed out goes to the driver's free. */
static int foreign(void) {
  PFN_cuMemAlloc_v3020 raw_alloc = (PFN_cuMemAlloc_v3020)A->fake_raw("cuMemAlloc_v2");
  PFN_cuMemAllocAsync_v11020 raw_alloc_async = (PFN_cuMemAllocAsync_v11020)A->fake_raw("cuMemAllocAsync");
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(raw_alloc(&p, 4096));
  CHECK_CU(A->mem_free(p));
  CHECK(stats().mem_free == 1);
  CHECK_CU(raw_alloc_async(&q, 4096, NULL));
  CHECK_CU(A->mem_free_async(q, NULL));
  CHECK(stats().mem_free_async == 1);
  CHECK(stats().mem_free_invalid == 0);
  return 0;
}

/* Out of memory after the retry path; the cache is given back on the way
 * and later allocations work.  Run with FAKE_CUDA_TOTAL_MB=64. */
static int oom(void) {
  CUdeviceptr p = 0, q = 0, r = 0;
  CHECK(A->mem_alloc(&p, 100 * MiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_CU(A->mem_alloc(&p, 30 * MiB));
  CHECK_CU(A->mem_free(p)); /* cached: 30 MiB held */
  CHECK_CU(A->mem_alloc(&q, 50 * MiB)); /* fits only once the cache is released */
  CHECK(stats().mem_free == 1);
  CHECK_CU(A->mem_alloc(&r, MiB));
  CHECK_CU(A->mem_free(q));
  CHECK_CU(A->mem_free(r));
  return 0;
}

/* Free memory counts what the cache could release. */
static int meminfo(void) {
  CUdeviceptr p = 0;
  size_t f = 0, t = 0;
  CHECK_CU(A->mem_alloc(&p, 20 * MiB));
  CHECK_CU(A->mem_free(p));
  struct fake_cuda_stats_t st = stats();
  CHECK(st.live_bytes >= 20 * MiB); /* the driver sees the cached segment as used */
  CHECK_CU(A->mem_get_info(&f, &t));
  CHECK(t == st.total_bytes);
  CHECK(f == t); /* everything cached is releasable */
  return 0;
}

/* ... and respects per_process_memory_fraction:0.5. */
static int meminfo_fraction(void) {
  CUdeviceptr p = 0;
  size_t f = 0, t = 0;
  CHECK_CU(A->mem_get_info(&f, &t));
  CHECK(f == t / 2);
  CHECK_CU(A->mem_alloc(&p, 20 * MiB));
  CHECK_CU(A->mem_get_info(&f, &t));
  CHECK(f == t / 2 - 20 * MiB); /* the 20 MiB segment is in use */
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_get_info(&f, &t));
  CHECK(f == t / 2);
  CHECK(A->mem_alloc(&p, t / 2 + MiB) == CUDA_ERROR_OUT_OF_MEMORY);
  return 0;
}

/* One cache per context; a free from another context goes to the owner. */
static int two_contexts(void) {
  ctx_create_fn create = (ctx_create_fn)A->fake_raw("cuCtxCreate_v2");
  CUcontext c1, c2;
  CUdeviceptr p = 0, q = 0, r = 0, s = 0;
  CHECK(create != NULL);
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(create(&c2, 0, 0));
  CHECK_CU(A->ctx_set_current(c1));
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->ctx_set_current(c2));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK(q != p);
  CHECK(stats().mem_alloc == 2); /* c1's cached block was not used in c2 */
  CHECK_CU(A->ctx_set_current(c1));
  CHECK_CU(A->mem_alloc(&r, MiB));
  CHECK(r == p);
  CHECK_CU(A->ctx_set_current(c2));
  CHECK_CU(A->mem_free(r)); /* c1's block freed while c2 is current */
  CHECK(stats().mem_free == 0);
  CHECK_CU(A->ctx_set_current(c1));
  CHECK_CU(A->mem_alloc(&s, MiB));
  CHECK(s == p);
  CHECK(stats().mem_alloc == 2);
  return 0;
}

/* A bad CACHALLOC_CONF item: one message on stderr, and the cache still
 * serves (issue 37: a typo costs only its own key). */
static int bad_conf(void) {
  char path[] = "/tmp/cachalloc-badconf-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);
  int saved = dup(2);
  dup2(fd, 2);
  CUdeviceptr p = 0, q = 0;
  CUresult r1 = A->mem_alloc(&p, 1000);
  CUresult r2 = A->mem_free(p);
  CUresult r3 = A->mem_alloc(&q, 1000);
  dup2(saved, 2);
  CHECK(r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS && r3 == CUDA_SUCCESS);
  char text[4096] = {0};
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  CHECK(n > 0);
  CHECK(strstr(text, "CACHALLOC_CONF") != NULL);
  CHECK(strstr(text, "bogus_key") != NULL);
  CHECK(strchr(text, '\n') == text + n - 1); /* exactly one line */
  CHECK(strstr(text, "disabled") == NULL);
  CHECK(q == p);                                     /* the freed block served again */
  CHECK(stats().mem_alloc == 1 && stats().mem_free == 0);
  return 0;
}

/* In a forked child the driver sees every call. */
static int forked(void) {
  CUdeviceptr p = 0;
  CHECK_CU(A->mem_alloc(&p, 1000));
  CHECK_CU(A->mem_free(p));
  pid_t pid = fork();
  if (pid == 0) {
    CUdeviceptr q = 0, r = 0;
    unsigned long before = stats().mem_alloc;
    if (A->mem_alloc(&q, 1000) != CUDA_SUCCESS || A->mem_free(q) != CUDA_SUCCESS) _exit(2);
    if (A->mem_alloc(&r, 1000) != CUDA_SUCCESS) _exit(3);
    _exit(stats().mem_alloc == before + 2 && stats().mem_free == 1 ? 0 : 4);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return 0;
}

/* Once exit() has begun, frees of cachalloc pointers are no-ops and nothing
 * reaches the driver.  The check runs in an atexit handler registered before
 * CUDA was first used, so it runs after cachalloc's own. */
static CUdeviceptr g_exit_ptr;
static void check_at_exit(void) {
  struct fake_cuda_stats_t before = stats();
  CUdeviceptr q = 0;
  int ok = A->mem_free(g_exit_ptr) == CUDA_SUCCESS && A->mem_alloc(&q, 1000) != CUDA_SUCCESS;
  struct fake_cuda_stats_t after = stats();
  ok = ok && after.mem_free == before.mem_free && after.mem_alloc == before.mem_alloc;
  if (!ok) {
    fprintf(stderr, "[%s] driver reached or free refused during exit\n", g_route);
    _exit(1);
  }
}
static int at_exit(void) {
  CHECK_CU(A->mem_alloc(&g_exit_ptr, 1000));
  return 0;
}

/* dlsym(RTLD_NEXT, ...) still means "after the caller" under the hook. */
static int rtld_next(void) {
  void* next = dlsym(RTLD_NEXT, "dlsym");
  void* first = dlsym(RTLD_DEFAULT, "dlsym");
  CHECK(next != NULL && next == first); /* the preloaded dlsym is next after the program */
  Dl_info info;
  CHECK(dladdr(first, &info) != 0 && strstr(info.dli_fname, "libcachalloc") != NULL);
  return 0;
}

struct behaviour {
  const char* name;
  int (*run)(void);
};

static const struct behaviour behaviours[] = {
  {"served", served},
  {"intercepted", intercepted},
  {"free_null", free_null},
  {"zero_size", zero_size},
  {"double_free", double_free},
  {"alignment", alignment},
  {"fence", fence},
  {"legacy_only", legacy_only},
  {"fence_legacy_reader", fence_legacy_reader},
  {"one_blocking_stream_serial", one_blocking_stream_serial},
  {"second_stream_waits", second_stream_waits},
  {"expandable", expandable},
  {"expandable_unmap_waits", expandable_unmap_waits},
  {"expandable_remap", expandable_remap},
  {"expandable_release_during_capture", expandable_release_during_capture},
  {"expandable_plain_handles", expandable_plain_handles},
  {"expandable_posix_fd_refused", expandable_posix_fd_refused},
  {"fence_blocking_stream", fence_blocking_stream},
  {"nonblocking_stream_fenced", nonblocking_stream_fenced},
  {"idle_streams_skipped", idle_streams_skipped},
  {"stream_destroyed_during_fence", stream_destroyed_during_fence},
  {"policy_stream", policy_stream},
  {"policy_device", policy_device},
  {"async_same_stream", async_same_stream},
  {"async_other_stream", async_other_stream},
  {"async_no_current_context", async_no_current_context},
  {"async_ptsz", async_ptsz},
  {"ptsz_fence", ptsz_fence},
  {"ptsz_threads", ptsz_threads},
  {"ptsz_other_thread", ptsz_other_thread},
  {"threads", threads},
  {"capture", capture},
  {"capture_global", capture_global},
  {"fence_during_capture", fence_during_capture},
  {"foreign", foreign},
  {"oom", oom},
  {"meminfo", meminfo},
  {"meminfo_fraction", meminfo_fraction},
  {"two_contexts", two_contexts},
  {"bad_conf", bad_conf},
  {"fork", forked},
  {"at_exit", at_exit},
  {"rtld_next", rtld_next},
};

int api_complete(const struct cuda_api* api) {
  const void* const* p = (const void* const*)api;
  size_t n = sizeof *api / sizeof(void*);
  for (size_t i = 0; i < n; ++i)
    if (p[i] == NULL) {
      fprintf(stderr, "function %zu of struct cuda_api was not found\n", i);
      return 0;
    }
  return 1;
}

int run_behaviour(const char* route, const char* name, const struct cuda_api* api) {
  static struct cuda_api copy; /* outlives main for the at_exit check */
  g_route = route;
  copy = *api;
  A = &copy;
  if (!api_complete(api)) return 1;
  if (strcmp(name, "at_exit") == 0) atexit(check_at_exit);
  for (size_t i = 0; i < sizeof behaviours / sizeof behaviours[0]; ++i) {
    if (strcmp(behaviours[i].name, name) != 0) continue;
    if (setup() != 0) return 1;
    return behaviours[i].run();
  }
  behaviour_fn run = stream_order_behaviour(name);
  if (run == NULL) run = host_behaviour(name);
  if (run == NULL) run = thread_cache_behaviour(name);
  if (run == NULL) run = watch_behaviour(name);
  if (run == NULL) run = fork_behaviour(name);
  if (run == NULL) run = graph_behaviour(name);
  if (run != NULL) {
    if (setup() != 0) return 1;
    return run();
  }
  fprintf(stderr, "unknown behaviour %s\n", name);
  return 1;
}
