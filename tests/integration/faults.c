/* faults.c — cachalloc over a driver that fails (issue 10, item 4).
 *
 * The fake driver fails chosen calls of one entry point (fake_cuda_fail) or
 * random calls of several (FAKE_CUDA_FAIL_RANDOM).  Under the shim, each
 * case checks that an allocation during the fault returns the driver's
 * error, or succeeds when cached memory serves it without a driver call;
 * that frees still work; that the buffers the program holds keep their data;
 * that allocation works again once the fault stops; and, at the end (all
 * freed, holds released, cachalloc's cache emptied: cachalloc_empty_cache(0)
 * when the shim has it, else, or with FAULTS_RELEASE_BY_OOM set, an
 * allocation past the device total, which runs the out-of-memory release),
 * that the fake holds what it holds after the same sequence without faults
 * (cachalloc's pooled events: no more).  That run is this program again,
 * spawned first with FAULTS_BASELINE_FD set: there every fault is left
 * unarmed and each expectation is the call's plain success.
 * cachalloc_validate, where the shim has it, checks cachalloc's invariants
 * along the way.
 *
 * Usage: faults ROUTE CASE   (ROUTE: proc = static cudart's cuGetProcAddress
 * chain, dlsym = numba's dlsym; CACHALLOC_CONF=expandable_segments:true
 * selects expandable segments).  Cases named probe_* are not registered:
 * they reproduce faults after which cachalloc reuses a block early (see
 * each); they pass once cachalloc waits, or keeps the block, instead. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "driver_api.h"
#include "fake_libcuda.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

extern char** environ;

static const char* g_route = "?";
static const char* g_case = "?";
static int g_faults = 1;     /* 0: the baseline run (nothing armed) */
static int g_expandable;     /* CACHALLOC_CONF asks for expandable segments */
static int g_probe;          /* a probe_* case: no baseline run to compare with */

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "[%s %s %s%s] %s:%d: check failed: %s\n", g_route, g_case,                 \
              g_expandable ? "expandable" : "classic", g_faults ? "" : " baseline", __FILE__, __LINE__, #cond); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)
#define RUN(call)       \
  do {                  \
    if (call) return 1; \
  } while (0)
/* What a call returns while `err` is injected: the error, or success in
 * the baseline run. */
#define FAULT(err) (g_faults ? (err) : CUDA_SUCCESS)

/* ---------------- the driver as the route hands it out ---------------- */

static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuCtxSynchronize_v2000 ctx_sync;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuStreamQuery_v2000 stream_query;
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 free;
  PFN_cuMemAllocAsync_v11020 alloc_async;
  PFN_cuMemFreeAsync_v11020 free_async;
  PFN_cuMemsetD8_v3020 memset8;
  PFN_cuMemcpyDtoH_v3020 dtoh;
  PFN_cuDeviceGetDefaultMemPool_v11020 default_pool;
  PFN_cuDeviceSetMemPool_v11020 set_pool;
  void (*stats)(struct fake_cuda_stats_t*);
  void (*hold)(CUstream, int);
  void (*fail)(const char*, int, int, CUresult);
  void (*fail_reset)(void);
  unsigned long (*injected)(CUresult);
  size_t (*live_imports)(void);
} D;
/* The shim's control API, where it has one. */
static int (*g_empty_cache)(int);
static int (*g_validate)(char*, size_t);

static int load_api(const char* route) {
  if (!driver_api_open(route)) return 0;
#define L(field, base, exported, version) DRIVER_API_ENTRY(D, field, base, exported, version)
  L(init, "cuInit", "cuInit", 2000);
  L(device_get, "cuDeviceGet", "cuDeviceGet", 2000);
  L(retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000);
  L(set_current, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000);
  L(ctx_sync, "cuCtxSynchronize", "cuCtxSynchronize", 2000);
  L(stream_create, "cuStreamCreate", "cuStreamCreate", 2000);
  L(stream_destroy, "cuStreamDestroy", "cuStreamDestroy_v2", 4000);
  L(stream_query, "cuStreamQuery", "cuStreamQuery", 2000);
  L(alloc, "cuMemAlloc", "cuMemAlloc_v2", 3020);
  L(free, "cuMemFree", "cuMemFree_v2", 3020);
  L(alloc_async, "cuMemAllocAsync", "cuMemAllocAsync", 11020);
  L(free_async, "cuMemFreeAsync", "cuMemFreeAsync", 11020);
  L(memset8, "cuMemsetD8", "cuMemsetD8_v2", 3020);
  L(dtoh, "cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020);
  L(default_pool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", 11020);
  L(set_pool, "cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020);
#undef L
  *(void**)&D.stats = driver_api_symbol("fake_cuda_stats");
  *(void**)&D.hold = driver_api_symbol("fake_cuda_hold_stream");
  *(void**)&D.fail = driver_api_symbol("fake_cuda_fail");
  *(void**)&D.fail_reset = driver_api_symbol("fake_cuda_fail_reset");
  *(void**)&D.injected = driver_api_symbol("fake_cuda_injected");
  *(void**)&D.live_imports = driver_api_symbol("fake_cuda_live_imports");
  if (!driver_api_complete(&D, sizeof D)) return 0;
  *(void**)&g_empty_cache = dlsym(RTLD_DEFAULT, "cachalloc_empty_cache");
  *(void**)&g_validate = dlsym(RTLD_DEFAULT, "cachalloc_validate");
  return 1;
}

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  D.stats(&s);
  return s;
}

/* Arms a fault (not in the baseline run). */
static void arm(const char* call, int after, int count, CUresult err) {
  if (g_faults) D.fail(call, after, count, err);
}

static int valid(void) {
  char msg[256] = "";
  if (g_validate != NULL && g_validate(msg, sizeof msg) != 0) {
    fprintf(stderr, "cachalloc_validate: %s\n", msg);
    return 0;
  }
  return 1;
}

/* ---------------- what the program holds ---------------- */

#define MAX_BUFS 512
#define MAX_STREAMS 8
static struct buf { CUdeviceptr p; size_t n; unsigned char v; CUstream s; } g_bufs[MAX_BUFS];
static int g_nbufs;
static unsigned char g_next_value = 1;
static CUstream g_streams[MAX_STREAMS];
static int g_nstreams;

/* A buffer is written and checked in three samples (head, middle, tail):
 * enough to see a block handed out twice, cheap for large buffers. */
#define SAMPLE (16 * KiB)
static void samples(const struct buf* b, size_t at[3], size_t* len) {
  *len = b->n < SAMPLE ? b->n : SAMPLE;
  at[0] = 0;
  at[1] = (b->n - *len) / 2;
  at[2] = b->n - *len;
}

static int intact(const struct buf* b) {
  static unsigned char h[SAMPLE];
  size_t at[3], len;
  samples(b, at, &len);
  for (int k = 0; k < 3; ++k) {
    if (D.dtoh(h, b->p + at[k], len) != CUDA_SUCCESS) return 0;
    for (size_t i = 0; i < len; ++i)
      if (h[i] != b->v) {
        fprintf(stderr, "buffer %#llx (%zu bytes): byte %zu is %u, not %u\n", (unsigned long long)b->p, b->n,
                at[k] + i, h[i], b->v);
        return 0;
      }
  }
  return 1;
}

static int all_intact(void) {
  for (int i = 0; i < g_nbufs; ++i) CHECK(intact(&g_bufs[i]));
  return 0;
}

/* Fills the new buffer p (n bytes, stream s) with a value of its own and keeps it. */
static int keep(CUdeviceptr p, size_t n, CUstream s) {
  CHECK(g_nbufs < MAX_BUFS);
  if (++g_next_value == 0) g_next_value = 1;
  struct buf b = {p, n, g_next_value, s};
  size_t at[3], len;
  samples(&b, at, &len);
  for (int k = 0; k < 3; ++k) CHECK_CU(D.memset8(p + at[k], b.v, len));
  g_bufs[g_nbufs++] = b;
  return 0;
}

static int find_buf(CUdeviceptr p) {
  for (int i = 0; i < g_nbufs; ++i)
    if (g_bufs[i].p == p) return i;
  return -1;
}

/* Checks the buffer, forgets it, frees it (cuMemFreeAsync on its stream
 * when it came from cuMemAllocAsync). */
static int free_kept(CUdeviceptr p) {
  int i = find_buf(p);
  CHECK(i >= 0);
  struct buf b = g_bufs[i];
  CHECK(intact(&b));
  g_bufs[i] = g_bufs[--g_nbufs];
  CHECK_CU(b.s != NULL ? D.free_async(p, b.s) : D.free(p));
  return 0;
}

/* cuMemAlloc of n bytes, which must return `want`; kept when it succeeds. */
static int alloc_expect(size_t n, CUresult want, CUdeviceptr* out) {
  CUdeviceptr p = 0;
  CUresult r = D.alloc(&p, n);
  if (r != want) fprintf(stderr, "cuMemAlloc(%zu): %d, expected %d\n", n, (int)r, (int)want);
  CHECK(r == want);
  if (r == CUDA_SUCCESS) RUN(keep(p, n, NULL));
  if (out != NULL) *out = p;
  return 0;
}

static int alloc_async_expect(size_t n, CUstream s, CUresult want, CUdeviceptr* out) {
  CUdeviceptr p = 0;
  CUresult r = D.alloc_async(&p, n, s);
  if (r != want) fprintf(stderr, "cuMemAllocAsync(%zu): %d, expected %d\n", n, (int)r, (int)want);
  CHECK(r == want);
  if (r == CUDA_SUCCESS) RUN(keep(p, n, s));
  if (out != NULL) *out = p;
  return 0;
}

static int new_stream(unsigned flags, CUstream* out) {
  CHECK(g_nstreams < MAX_STREAMS);
  CHECK_CU(D.stream_create(out, flags));
  g_streams[g_nstreams++] = *out;
  return 0;
}

/* ---------------- the end: what the fake still holds ---------------- */

#define NCOUNTERS 8
static void counters(unsigned long* c) {
  struct fake_cuda_stats_t s = stats();
  unsigned long v[NCOUNTERS] = {s.live_allocs, s.live_bytes, s.live_events, s.live_streams,
                                s.live_vm_handles, s.live_reservations, s.live_mappings, D.live_imports()};
  memcpy(c, v, sizeof v);
}
static const char* const counter_names[NCOUNTERS] = {"live_allocs", "live_bytes", "live_events", "live_streams",
                                                     "live_vm_handles", "live_reservations", "live_mappings", "live_imports"};
static unsigned long g_baseline[NCOUNTERS];
static int g_report_fd = -1;
/* cachalloc keeps the events it created in a pool: after faults it may hold
 * fewer (a free that synchronized made none), never more, except by this
 * much in random mode (the two runs' sequences differ, and so does the
 * pool's high-water mark). */
static unsigned long g_event_slack;

/* The fault has stopped: everything works again, then everything goes back
 * and the fake's counters are compared with the baseline run's. */
static int finish(void) {
  D.fail_reset();
  for (int i = 0; i < g_nstreams; ++i) D.hold(g_streams[i], 0);
  D.hold(NULL, 0);
  CHECK(valid());
  RUN(all_intact());
  CUdeviceptr p, q;
  CHECK_CU(D.alloc(&p, 3000));
  CHECK_CU(D.alloc(&q, 40 * MiB));
  RUN(keep(p, 3000, NULL));
  RUN(keep(q, 40 * MiB, NULL));
  while (g_nbufs > 0) RUN(free_kept(g_bufs[g_nbufs - 1].p));
  for (int i = 0; i < g_nstreams; ++i) CHECK_CU(D.stream_destroy(g_streams[i]));
  g_nstreams = 0;
  CHECK(valid());
  if (g_empty_cache != NULL && getenv("FAULTS_RELEASE_BY_OOM") == NULL) {
    CHECK(g_empty_cache(0) == 0);
  } else {
    CHECK(D.alloc(&p, (size_t)64 << 30) == CUDA_ERROR_OUT_OF_MEMORY); /* releases every cached segment */
  }
  CHECK(valid());
  unsigned long c[NCOUNTERS];
  counters(c);
  CHECK(c[0] == 0 && c[1] == 0 && c[3] == 0 && c[4] == 0 && c[6] == 0 && c[7] == 0); /* nothing busy, nothing cached */
  if (g_report_fd >= 0) {
    FILE* f = fdopen(g_report_fd, "w");
    for (int i = 0; i < NCOUNTERS; ++i) fprintf(f, "%lu\n", c[i]);
    fclose(f);
    return 0;
  }
  if (g_probe) return 0;
  fprintf(stderr, "the fake holds %lu events, %lu reservations (without the faults: %lu, %lu)\n", c[2], c[5],
          g_baseline[2], g_baseline[5]);
  int same = 1;
  for (int i = 0; i < NCOUNTERS; ++i) {
    const unsigned long allowed = g_baseline[i] + (i == 2 ? g_event_slack : 0);
    if (c[i] > allowed || (i != 2 && c[i] != g_baseline[i])) {
      fprintf(stderr, "%s: %lu after the faults, %lu without\n", counter_names[i], c[i], g_baseline[i]);
      same = 0;
    }
  }
  CHECK(same);
  return 0;
}

/* ---------------- segment allocation (cuMemAlloc_v2) ---------------- */

/* Classic segments come from cuMemAlloc: a request the cache cannot serve
 * gets the driver's error; one it can serve needs no driver call.  A single
 * out-of-memory refusal is absorbed by the retry after releasing cached
 * memory.  Expandable segments never call cuMemAlloc. */
static int mem_alloc(void) {
  const CUresult E = CUDA_ERROR_UNKNOWN;
  CUdeviceptr cached, p;
  RUN(alloc_expect(4 * KiB, CUDA_SUCCESS, NULL));
  RUN(alloc_expect(30 * MiB, CUDA_SUCCESS, NULL));
  CHECK_CU(D.alloc(&cached, 4 * MiB));
  CHECK_CU(D.free(cached));
  const struct fake_cuda_stats_t s0 = stats();
  arm("cuMemAlloc_v2", 0, -1, E);
  RUN(alloc_expect(4 * MiB, CUDA_SUCCESS, &p)); /* the cached block */
  CHECK(p == cached);
  RUN(alloc_expect(8 * KiB, CUDA_SUCCESS, NULL)); /* beside the 4 KiB one */
  CHECK(stats().mem_alloc == s0.mem_alloc && stats().failures_injected == s0.failures_injected);
  RUN(alloc_expect(64 * MiB, g_expandable ? CUDA_SUCCESS : FAULT(E), NULL));
  RUN(alloc_expect(64 * MiB, g_expandable ? CUDA_SUCCESS : FAULT(E), NULL)); /* still */
  if (g_faults) CHECK(stats().failures_injected == s0.failures_injected + (g_expandable ? 0 : 2));
  RUN(free_kept(p));
  RUN(all_intact());
  CHECK(valid());
  /* Out of memory until reset: the cache gives back what it holds, retries, reports. */
  arm("cuMemAlloc_v2", 0, -1, CUDA_ERROR_OUT_OF_MEMORY);
  RUN(alloc_expect(70 * MiB, g_expandable ? CUDA_SUCCESS : FAULT(CUDA_ERROR_OUT_OF_MEMORY), NULL));
  RUN(all_intact());
  /* Once: the retry succeeds. */
  const unsigned long before = stats().failures_injected;
  arm("cuMemAlloc_v2", 0, 1, CUDA_ERROR_OUT_OF_MEMORY);
  RUN(alloc_expect(96 * MiB, CUDA_SUCCESS, NULL));
  if (g_faults) CHECK(stats().failures_injected == before + (g_expandable ? 0 : 1));
  if (g_faults && !g_expandable) CHECK(D.injected(E) == 2 && D.injected(CUDA_ERROR_OUT_OF_MEMORY) >= 2);
  D.fail_reset();
  RUN(alloc_expect(64 * MiB, CUDA_SUCCESS, NULL));
  return finish();
}

/* cachalloc serves cuMemAllocAsync itself (from cuMemAlloc segments): the
 * driver's cuMemAllocAsync failing changes nothing until the program
 * configures a memory pool, after which the call goes to the driver and its
 * error comes back. */
static int mem_alloc_async(void) {
  const CUresult E = CUDA_ERROR_UNKNOWN, E2 = CUDA_ERROR_ILLEGAL_ADDRESS;
  CUstream s;
  RUN(new_stream(0, &s));
  const struct fake_cuda_stats_t s0 = stats();
  arm("cuMemAllocAsync", 0, -1, E);
  RUN(alloc_async_expect(4 * MiB, s, CUDA_SUCCESS, NULL));
  RUN(alloc_async_expect(64 * MiB, s, CUDA_SUCCESS, NULL));
  RUN(alloc_async_expect(4 * KiB, NULL, CUDA_SUCCESS, NULL));
  CHECK(stats().failures_injected == s0.failures_injected && stats().mem_alloc_async == s0.mem_alloc_async);
  arm("cuMemAlloc_v2", 0, -1, E2);
  RUN(alloc_async_expect(100 * MiB, s, g_expandable ? CUDA_SUCCESS : FAULT(E2), NULL));
  RUN(alloc_async_expect(2 * MiB, s, CUDA_SUCCESS, NULL)); /* from the 64 MiB one's segment or pages */
  D.fail_reset();
  RUN(all_intact());
  /* Pools configured: cuMemAllocAsync is the driver's. */
  CUmemoryPool pool;
  CHECK_CU(D.default_pool(&pool, 0));
  CHECK_CU(D.set_pool(0, pool));
  arm("cuMemAllocAsync", 0, 1, E);
  RUN(alloc_async_expect(MiB, s, FAULT(E), NULL));
  RUN(alloc_async_expect(MiB, s, CUDA_SUCCESS, NULL));
  if (g_faults) CHECK(D.injected(E) == 1 && (g_expandable || D.injected(E2) == 1));
  return finish();
}

/* ---------------- events: a fenced free ---------------- */

/* Allocates and frees 2 rounds of 32 kept 1 MiB blocks (so the cache misses
 * and fences get recorded); *reused says whether p was handed out again. */
/* 128 MiB kept allocated (freed by finish()): more than the churn below
 * frees, so a miss grows rather than waits for a fence (wait_oldest_fence
 * waits only while more bytes wait than are allocated), and the cases see
 * their fences pending. */
static int ballast(void) { return alloc_expect(128 * MiB, CUDA_SUCCESS, NULL); }

static int churn(CUdeviceptr p, int* reused) {
  enum { N = 32 };
  CUdeviceptr b[N];
  *reused = 0;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < N; ++i) {
      RUN(alloc_expect(MiB, CUDA_SUCCESS, &b[i]));
      *reused |= b[i] == p;
    }
    for (int i = 0; i < N; ++i) RUN(free_kept(b[i]));
  }
  return 0;
}

/* With a second stream alive a plain free waits for a fence (one event on
 * the legacy stream per batch of frees, recorded when the cache misses);
 * without an event (cuEventCreate or cuEventRecord failing) cachalloc
 * synchronizes the device instead.  Either way a block freed while a held
 * stream may still use it comes back only after something waited. */
static int fenced_free_without_event(const char* call, CUresult err) {
  CUstream s;
  CUdeviceptr p;
  RUN(ballast());
  RUN(new_stream(0, &s));
  D.hold(s, 1); /* a kernel on s still uses what is freed */
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  arm(call, 0, -1, err);
  const struct fake_cuda_stats_t b = stats();
  RUN(free_kept(p));
  CHECK(stats().event_record == b.event_record && stats().ctx_sync == b.ctx_sync); /* nothing at the free */
  int reused = 0;
  RUN(churn(p, &reused));
  const struct fake_cuda_stats_t a = stats();
  /* (or reused after a join ordered all later work after the fence:
   * cuCtxWaitEvent, no wait on the host) */
  const int joined = a.ctx_wait_event > b.ctx_wait_event;
  if (g_faults) {
    CHECK((a.ctx_sync > b.ctx_sync || joined) && reused); /* no fence: synchronized, then reused */
  } else {
    CHECK(a.event_record > b.event_record && a.ctx_sync == b.ctx_sync && (!reused || joined));
  }
  RUN(all_intact());
  CHECK(valid());
  if (g_faults) CHECK(D.injected(err) >= 1);
  D.fail_reset();
  D.hold(s, 0);
  return finish();
}

static int event_create(void) { return fenced_free_without_event("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY); }
static int event_record(void) { return fenced_free_without_event("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED); }

/* Allocates kept 1 MiB blocks until p comes back (*reused = 1) or the
 * device grows (*reused = 0: the cache had nothing left, p stays out), then
 * frees them.  The cache takes every reclaimable block before it grows, so
 * this tells exactly whether p is reusable. */
static int probe_reuse(CUdeviceptr p, int* reused) {
  CUdeviceptr b[256];
  int n = 0;
  *reused = 0;
  while (n < 256) {
    const size_t before = stats().live_bytes;
    RUN(alloc_expect(MiB, CUDA_SUCCESS, &b[n]));
    if (b[n++] == p) {
      *reused = 1;
      break;
    }
    if (stats().live_bytes > before) break;
  }
  if (getenv("FAULTS_DEBUG")) fprintf(stderr, "probe: %d blocks, reused %d, faults %d\n", n, *reused, g_faults);
  for (int i = 0; i < n; ++i) RUN(free_kept(b[i]));
  return 0;
}

/* cuEventQuery failing while a fence is polled: the fence is waited for
 * (cuEventSynchronize), then its blocks are reused.  Reporting "not ready"
 * for ever: the blocks stay parked, nothing else is lost. */
static int event_query(void) {
  CUstream s;
  CUdeviceptr p, q;
  int reused = 0;
  RUN(ballast());
  RUN(new_stream(0, &s));
  D.hold(s, 1);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  RUN(free_kept(p));
  RUN(churn(p, &reused)); /* fences recorded; s is busy, so they wait */
  CHECK(!reused);
  arm("cuEventQuery", 0, 1, CUDA_ERROR_UNKNOWN);
  const struct fake_cuda_stats_t b = stats();
  RUN(probe_reuse(p, &reused));
  const struct fake_cuda_stats_t a = stats();
  if (g_faults) {
    CHECK(a.event_sync > b.event_sync && reused); /* waited for, then reused */
  } else {
    CHECK(a.event_sync == b.event_sync && !reused); /* still pending */
  }
  D.fail_reset();
  D.hold(s, 0);
  CHECK_CU(D.ctx_sync()); /* nothing pending on the device */
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &q));
  RUN(free_kept(q));
  arm("cuEventQuery", 0, -1, CUDA_ERROR_NOT_READY);
  RUN(churn(q, &reused));
  RUN(probe_reuse(q, &reused));
  CHECK(reused == (g_faults == 0)); /* done, but reported not ready: not reused */
  RUN(all_intact());
  D.fail_reset();
  int seen = 0;
  RUN(churn(q, &seen));
  RUN(probe_reuse(q, &reused));
  CHECK(seen || reused);
  /* Fences keep their events for reuse; the faulted run had one more fence
   * in flight at a time, so one more pooled event (not a leak: bounded). */
  g_event_slack = 1;
  return finish();
}

/* cuEventSynchronize failing where cachalloc waits for pending frees before
 * releasing memory (the out-of-memory path): the allocation reports the
 * device's out-of-memory, nothing held is touched, and everything works
 * once the fault stops. */
static int event_sync(void) {
  CUstream s;
  CUdeviceptr p;
  RUN(new_stream(0, &s));
  D.hold(s, 1);
  RUN(alloc_expect(4 * MiB, CUDA_SUCCESS, &p));
  RUN(alloc_expect(MiB, CUDA_SUCCESS, NULL));
  RUN(free_kept(p)); /* pending on s: its whole segment is freed after the wait */
  arm("cuEventSynchronize", 0, -1, CUDA_ERROR_UNKNOWN);
  RUN(alloc_expect((size_t)64 << 30, CUDA_ERROR_OUT_OF_MEMORY, NULL));
  if (g_faults) CHECK(D.injected(CUDA_ERROR_UNKNOWN) >= 1);
  RUN(all_intact());
  CHECK(valid());
  D.hold(s, 0);
  D.fail_reset();
  RUN(alloc_expect(4 * MiB, CUDA_SUCCESS, NULL));
  return finish();
}

/* cuCtxSynchronize failing where cachalloc has no event to wait for (the
 * fence's cuEventRecord fails too): the freed blocks stay parked — never
 * reused early — and come back once a synchronization succeeds. */
static int ctx_sync(void) {
  CUstream s;
  CUdeviceptr p;
  int reused = 0;
  RUN(ballast());
  RUN(new_stream(CU_STREAM_NON_BLOCKING, &s));
  D.hold(s, 1);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  arm("cuCtxSynchronize", 0, -1, CUDA_ERROR_UNKNOWN);
  if (g_faults) D.fail("cuEventRecord", 0, -1, CUDA_ERROR_LAUNCH_FAILED);
  RUN(free_kept(p)); /* a plain free never fails: it makes no driver call */
  RUN(churn(p, &reused));
  RUN(probe_reuse(p, &reused));
  CHECK(!reused); /* with faults: no fence, no synchronization; without: s is busy */
  RUN(all_intact());
  CHECK(valid());
  D.fail_reset();
  D.hold(s, 0);
  int seen = 0;
  RUN(churn(p, &seen));
  RUN(probe_reuse(p, &reused));
  CHECK(seen || reused);
  return finish();
}

/* ---------------- virtual memory (expandable segments) ---------------- */

/* Maps pages in runs (cuMemCreate + cuMemMap per run of up to 64 MiB, one
 * cuMemSetAccess per grow): a failure on the second run of a three-run grow
 * (130 MiB in 20 MiB pages: runs of 3, 3 and 1 pages), or on the grow's
 * access grant, is rolled back, the first run included, and returns the
 * driver's error; the next grow works.  Classic segments never reach these
 * calls. */
static int vm_page_fault(const char* call) {
  const CUresult E = CUDA_ERROR_UNKNOWN;
  RUN(alloc_expect(4 * KiB, CUDA_SUCCESS, NULL)); /* small pool only: the large one starts empty */
  const struct fake_cuda_stats_t b = stats();
  arm(call, strcmp(call, "cuMemSetAccess") == 0 ? 0 : 1, 1, E);
  RUN(alloc_expect(130 * MiB, g_expandable ? FAULT(E) : CUDA_SUCCESS, NULL));
  const struct fake_cuda_stats_t a = stats();
  if (g_faults && g_expandable) {
    CHECK(a.failures_injected == b.failures_injected + 1);
    CHECK(a.live_mappings == b.live_mappings && a.live_vm_handles == b.live_vm_handles &&
          a.live_bytes == b.live_bytes); /* rolled back */
    CHECK(a.vm_map - b.vm_map == a.vm_unmap - b.vm_unmap);
    CHECK(a.vm_create - b.vm_create == a.vm_release - b.vm_release);
    CHECK(a.vm_create - b.vm_create >= 1); /* a run was made, then undone */
    CHECK(valid());
    RUN(alloc_expect(130 * MiB, CUDA_SUCCESS, NULL));
  }
  CHECK(stats().live_mappings == b.live_mappings + (g_expandable ? 3 : 0));
  /* Failing for ever: grows fail, cached pages still serve. */
  arm(call, 0, -1, E);
  RUN(alloc_expect(9 * MiB, CUDA_SUCCESS, NULL)); /* inside the last page */
  RUN(alloc_expect(200 * MiB, g_expandable ? FAULT(E) : CUDA_SUCCESS, NULL));
  RUN(all_intact());
  CHECK(valid());
  D.fail_reset();
  RUN(alloc_expect(200 * MiB, CUDA_SUCCESS, NULL));
  return finish();
}

static int vm_create(void) { return vm_page_fault("cuMemCreate"); }
static int vm_map(void) { return vm_page_fault("cuMemMap"); }
static int vm_set_access(void) { return vm_page_fault("cuMemSetAccess"); }

/* cuMemCreate refusing shareable handles once (CUDA_ERROR_NOT_SUPPORTED):
 * cachalloc asks again for plain handles and the allocation succeeds. */
static int vm_create_unshareable(void) {
  arm("cuMemCreate", 0, 1, CUDA_ERROR_NOT_SUPPORTED);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, NULL));
  if (g_faults) CHECK(stats().failures_injected == (g_expandable ? 1u : 0u));
  RUN(alloc_expect(30 * MiB, CUDA_SUCCESS, NULL));
  return finish();
}

/* Each (pool, stream) of expandable segments reserves its address range at
 * its first allocation: a refused reservation is the allocation's error and
 * leaves nothing reserved; the other streams keep working. */
static int vm_reserve(void) {
  const CUresult E = CUDA_ERROR_UNKNOWN;
  CUstream s;
  RUN(new_stream(0, &s));
  RUN(alloc_expect(MiB, CUDA_SUCCESS, NULL));
  const unsigned long reserved = stats().live_reservations;
  arm("cuMemAddressReserve", 0, -1, E);
  RUN(alloc_async_expect(MiB, s, g_expandable ? FAULT(E) : CUDA_SUCCESS, NULL));
  RUN(alloc_async_expect(30 * MiB, s, g_expandable ? FAULT(E) : CUDA_SUCCESS, NULL));
  if (g_faults) CHECK(stats().live_reservations == reserved);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, NULL)); /* the legacy stream's small pool is reserved */
  RUN(all_intact());
  D.fail_reset();
  RUN(alloc_async_expect(MiB, s, CUDA_SUCCESS, NULL));
  RUN(alloc_async_expect(30 * MiB, s, CUDA_SUCCESS, NULL));
  if (g_expandable) CHECK(stats().live_reservations == reserved + 2);
  return finish();
}

/* ---------------- streams ---------------- */

/* cachalloc never queries streams: the program's cuStreamQuery gets the
 * driver's error, allocations and frees go on. */
static int stream_query(void) {
  CUstream s;
  CUdeviceptr p;
  RUN(new_stream(0, &s));
  arm("cuStreamQuery", 0, -1, CUDA_ERROR_UNKNOWN);
  CHECK(D.stream_query(s) == FAULT(CUDA_ERROR_UNKNOWN));
  RUN(alloc_async_expect(MiB, s, CUDA_SUCCESS, &p));
  RUN(free_kept(p));
  RUN(alloc_expect(30 * MiB, CUDA_SUCCESS, &p));
  RUN(free_kept(p));
  CHECK(D.stream_query(NULL) == FAULT(CUDA_ERROR_UNKNOWN));
  if (g_faults) CHECK(stats().failures_injected == 2);
  D.fail_reset();
  CHECK_CU(D.stream_query(s));
  return finish();
}

/* A stream the driver did not create is not one cachalloc fences for:
 * frees stay stream-ordered (reused at once), as with the legacy stream and
 * the one blocking stream main() made; with the stream created (a second
 * blocking one), the free waits for a fence. */
static int stream_create(void) {
  CUstream s = NULL;
  CUdeviceptr p, q;
  arm("cuStreamCreate", 0, -1, CUDA_ERROR_OUT_OF_MEMORY);
  CUresult r = D.stream_create(&s, 0);
  CHECK(r == FAULT(CUDA_ERROR_OUT_OF_MEMORY));
  if (r == CUDA_SUCCESS) g_streams[g_nstreams++] = s;
  D.hold(NULL, 1);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  const unsigned long records = stats().event_record;
  RUN(free_kept(p));
  CHECK(stats().event_record == records); /* fenced or not, nothing at the free */
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &q));
  CHECK((q == p) == (g_faults != 0));
  D.hold(NULL, 0);
  D.fail_reset();
  if (g_faults) RUN(new_stream(0, &s));
  return finish();
}

/* cuStreamDestroy: cachalloc first records an event on the dying stream
 * for every block cached on it (they may be reused on other streams once it
 * completes); with cuEventRecord failing it synchronizes the device
 * instead.  The stream is destroyed all the same and nothing is lost. */
static int stream_destroy(void) {
  CUstream s;
  CUdeviceptr p, q;
  RUN(new_stream(0, &s));
  RUN(alloc_async_expect(MiB, s, CUDA_SUCCESS, &p));
  RUN(alloc_async_expect(30 * MiB, s, CUDA_SUCCESS, &q));
  RUN(alloc_expect(3 * MiB, CUDA_SUCCESS, NULL));
  RUN(free_kept(p)); /* on its own stream: cached at once */
  RUN(free_kept(q));
  arm("cuEventRecord", 0, -1, CUDA_ERROR_LAUNCH_FAILED);
  const struct fake_cuda_stats_t b = stats();
  CHECK_CU(D.stream_destroy(s));
  g_streams[--g_nstreams] = NULL;
  const struct fake_cuda_stats_t a = stats();
  if (g_faults) {
    CHECK(a.ctx_sync == b.ctx_sync + 1 && a.event_record == b.event_record);
  } else {
    CHECK(a.event_record > b.event_record && a.ctx_sync == b.ctx_sync);
  }
  CHECK(a.record_on_dead_stream == 0 && a.live_streams == b.live_streams - 1);
  RUN(all_intact());
  CHECK(valid());
  D.fail_reset();
  RUN(alloc_expect(MiB, CUDA_SUCCESS, NULL));
  RUN(alloc_expect(30 * MiB, CUDA_SUCCESS, NULL));
  return finish();
}

/* ---------------- random faults ---------------- */

static unsigned long long g_rng = 0x2545f4914f6cdd1dULL;
static unsigned rnd(unsigned n) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (unsigned)(g_rng % n);
}

/* An error cachalloc returned: success, or one the fake injected. */
static int injected_or_success(CUresult r) {
  if (r == CUDA_SUCCESS || D.injected(r) > 0) return 1;
  fprintf(stderr, "error %d was never injected\n", (int)r);
  return 0;
}

/* 2,000 random operations (allocations on four streams, frees, holds,
 * synchronizations, queries, releases of the cache) while
 * FAKE_CUDA_FAIL_RANDOM fails calls of every fault point: every error seen
 * is one the fake injected, a free that failed leaves its buffer allocated,
 * every buffer keeps its data, cachalloc's invariants hold. */
static int random_ops(void) {
  CUstream streams[4] = {NULL};
  RUN(new_stream(0, &streams[1]));
  RUN(new_stream(0, &streams[2]));
  RUN(new_stream(CU_STREAM_NON_BLOCKING, &streams[3]));
  size_t live = 0;
  unsigned failed_allocs = 0, failed_frees = 0;
  for (int op = 0; op < 2000; ++op) {
    const unsigned what = rnd(100);
    if (what < 45 && live < 400 * MiB) {
      static const size_t sizes[] = {512, 4 * KiB, 100 * KiB, MiB, 3 * MiB, 9 * MiB, 24 * MiB};
      const size_t n = sizes[rnd(7)] + rnd(4096);
      CUstream s = streams[rnd(4)];
      CUdeviceptr p = 0;
      const int async = rnd(2);
      CUresult r = async ? D.alloc_async(&p, n, s) : D.alloc(&p, n);
      CHECK(injected_or_success(r));
      if (r == CUDA_SUCCESS) {
        RUN(keep(p, n, async ? s : NULL));
        live += n;
      } else {
        failed_allocs++;
      }
    } else if (what < 80 && g_nbufs > 0) {
      const int i = (int)rnd((unsigned)g_nbufs);
      struct buf b = g_bufs[i];
      CHECK(intact(&b));
      CUresult r = b.s != NULL && rnd(2) ? D.free_async(b.p, b.s) : D.free(b.p);
      CHECK(injected_or_success(r));
      if (r == CUDA_SUCCESS) {
        g_bufs[i] = g_bufs[--g_nbufs];
        live -= b.n;
      } else {
        failed_frees++; /* still allocated: checked and freed later */
      }
    } else if (what < 88) {
      D.hold(streams[rnd(4)], (int)rnd(2));
    } else if (what < 92) {
      CHECK(injected_or_success(D.ctx_sync()));
    } else if (what < 96) {
      CUresult r = D.stream_query(streams[rnd(4)]);
      CHECK(r == CUDA_ERROR_NOT_READY || injected_or_success(r));
    } else if (what < 97) {
      /* Past the device: the out-of-memory path releases the cache (waiting
       * for pending frees, unmapping pages), whatever fails meanwhile. */
      CUdeviceptr p;
      CUresult r = D.alloc(&p, (size_t)64 << 30);
      CHECK(r == CUDA_ERROR_OUT_OF_MEMORY || (r != CUDA_SUCCESS && injected_or_success(r)));
    } else {
      RUN(all_intact());
    }
    if (op % 250 == 0) CHECK(valid());
  }
  if (g_faults) {
    fprintf(stderr, "%lu calls failed: %u allocations, %u frees refused\n", stats().failures_injected, failed_allocs,
            failed_frees);
    /* Frees make no driver call any more (fences are batched): fewer calls
     * to fail than before, still enough to exercise every path. */
    CHECK(stats().failures_injected > 10);
  }
  /* Pooled fence events, not a leak: a failed context-wide record switches
   * fences to one event per busy stream (4 streams here), and faults leave
   * more fences in flight at once; each pooled fence keeps its events. */
  g_event_slack = 8;
  return finish();
}

/* ---------------- probes: double faults (not registered) ---------------- */

/* cuEventRecord and then cuCtxSynchronize failing in one fenced free: the
 * free succeeds and the block is handed out again at once, while the held
 * stream may still use it. */
static int probe_record_and_sync(void) {
  CUstream s;
  CUdeviceptr p, q;
  RUN(new_stream(0, &s));
  D.hold(s, 1);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  arm("cuEventRecord", 0, -1, CUDA_ERROR_LAUNCH_FAILED);
  arm("cuCtxSynchronize", 0, -1, CUDA_ERROR_LAUNCH_FAILED);
  RUN(free_kept(p));
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &q));
  CHECK(q != p); /* nothing waited for s */
  return finish();
}

/* cuEventQuery and cuEventSynchronize both failing on a pending free: the
 * block is reused although its event was never waited for. */
static int probe_query_and_sync(void) {
  CUstream s;
  CUdeviceptr p, q;
  RUN(new_stream(0, &s));
  D.hold(s, 1);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  RUN(free_kept(p));
  arm("cuEventQuery", 0, -1, CUDA_ERROR_UNKNOWN);
  arm("cuEventSynchronize", 0, -1, CUDA_ERROR_UNKNOWN);
  arm("cuCtxSynchronize", 0, -1, CUDA_ERROR_UNKNOWN); /* else a device sync bounds the work */
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &q));
  CHECK(q != p);
  return finish();
}

/* cuEventSynchronize failing alone in the out-of-memory path: a pending
 * block of a segment that stays in use is put back in the pool without any
 * wait, and the next allocation gets it while the held stream may still
 * use it. */
static int probe_oom_sync(void) {
  CUstream s;
  CUdeviceptr p, q;
  RUN(new_stream(0, &s));
  D.hold(s, 1);
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &p));
  RUN(alloc_expect(512 * KiB, CUDA_SUCCESS, NULL)); /* same small segment: it stays */
  RUN(free_kept(p));
  const struct fake_cuda_stats_t b = stats();
  arm("cuEventSynchronize", 0, -1, CUDA_ERROR_UNKNOWN);
  RUN(alloc_expect((size_t)64 << 30, CUDA_ERROR_OUT_OF_MEMORY, NULL));
  RUN(alloc_expect(MiB, CUDA_SUCCESS, &q));
  const struct fake_cuda_stats_t a = stats();
  CHECK(q != p || a.ctx_sync > b.ctx_sync || a.event_sync > b.event_sync); /* reused only after a wait */
  return finish();
}

/* cuCtxWaitEvent failing when a miss would join the frees waiting behind a
 * fence: the join is given up (for good: the shim stops asking), the miss
 * grows or waits on the host instead, and nothing is reused while the busy
 * stream may still use it.  Without the fault the block comes back at once,
 * after a join. */
static int join_fault(void) {
  CUstream s;
  CUdeviceptr p, q;
  RUN(ballast());
  RUN(new_stream(CU_STREAM_NON_BLOCKING, &s));
  D.hold(s, 1);
  RUN(alloc_expect(12 * MiB, CUDA_SUCCESS, &p));
  arm("cuCtxWaitEvent", 0, -1, CUDA_ERROR_UNKNOWN);
  const struct fake_cuda_stats_t b = stats();
  RUN(free_kept(p));
  RUN(alloc_expect(12 * MiB, CUDA_SUCCESS, &q));
  const struct fake_cuda_stats_t a = stats();
  if (g_faults) {
    CHECK(D.injected(CUDA_ERROR_UNKNOWN) >= 1);
    CHECK(a.ctx_wait_event == b.ctx_wait_event);
    CHECK(q != p || a.event_sync > b.event_sync || a.ctx_sync > b.ctx_sync); /* reused only after a wait */
  } else {
    CHECK(q == p && a.ctx_wait_event > b.ctx_wait_event);
  }
  RUN(free_kept(q));
  RUN(all_intact());
  CHECK(valid());
  D.fail_reset();
  D.hold(s, 0);
  return finish();
}

/* ---------------- main ---------------- */

static const struct { const char* name; int (*run)(void); } cases[] = {
  {"mem_alloc", mem_alloc},
  {"mem_alloc_async", mem_alloc_async},
  {"event_create", event_create},
  {"event_record", event_record},
  {"event_query", event_query},
  {"event_sync", event_sync},
  {"ctx_sync", ctx_sync},
  {"vm_create", vm_create},
  {"vm_create_unshareable", vm_create_unshareable},
  {"vm_map", vm_map},
  {"vm_set_access", vm_set_access},
  {"vm_reserve", vm_reserve},
  {"stream_query", stream_query},
  {"stream_create", stream_create},
  {"stream_destroy", stream_destroy},
  {"random", random_ops},
  {"probe_record_and_sync", probe_record_and_sync},
  {"probe_query_and_sync", probe_query_and_sync},
  {"probe_oom_sync", probe_oom_sync},
  {"join_fault", join_fault},
};

/* The same case without faults, in a fresh process: its final counters. */
static int run_baseline(char** argv) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  char fd_env[32];
  snprintf(fd_env, sizeof fd_env, "FAULTS_BASELINE_FD=%d", fds[1]);
  size_t n = 0;
  while (environ[n] != NULL) n++;
  char** env = calloc(n + 2, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (strncmp(environ[i], "FAKE_CUDA_FAIL_RANDOM=", 22) != 0) env[k++] = environ[i];
  env[k++] = fd_env;
  pid_t pid;
  CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env) == 0);
  free(env);
  close(fds[1]);
  FILE* f = fdopen(fds[0], "r");
  int got = 0;
  for (int i = 0; i < NCOUNTERS; ++i) got += fscanf(f, "%lu", &g_baseline[i]) == 1;
  fclose(f);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fprintf(stderr, "the baseline run failed\n");
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == NCOUNTERS);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s proc|dlsym CASE\n", argv[0]);
    return 2;
  }
  g_route = argv[1];
  g_case = argv[2];
  setvbuf(stderr, NULL, _IONBF, 0);
  const char* conf = getenv("CACHALLOC_CONF");
  g_expandable = conf != NULL && strstr(conf, "expandable_segments:true") != NULL;
  const char* fd = getenv("FAULTS_BASELINE_FD");
  if (fd != NULL) {
    g_faults = 0;
    g_report_fd = atoi(fd);
  }
  int (*run)(void) = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
    if (strcmp(cases[i].name, g_case) == 0) run = cases[i].run;
  if (run == NULL) {
    fprintf(stderr, "unknown case %s\n", g_case);
    return 2;
  }
  g_probe = strncmp(g_case, "probe_", 6) == 0;
  if (g_faults && !g_probe && run_baseline(argv)) return 1;
  if (!load_api(g_route)) {
    fprintf(stderr, "the route could not reach every driver function\n");
    return 1;
  }
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(D.init(0));
  CHECK_CU(D.device_get(&dev, 0));
  CHECK_CU(D.retain(&ctx, dev));
  CHECK_CU(D.set_current(ctx));
  /* A blocking stream from the start (as cuBLASLt makes in every PyTorch
   * program), so that each case's own stream is a second one: frees are
   * fenced from then on, which is what these cases inject faults into.
   * (With random faults on, a failure here just leaves the cases serial.) */
  CUstream anchor;
  if (D.stream_create(&anchor, 0) == CUDA_SUCCESS) g_streams[g_nstreams++] = anchor;
  return run();
}
