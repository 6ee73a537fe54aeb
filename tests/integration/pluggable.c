/* pluggable.c — PyTorch's pluggable allocator ABI (cachalloc_malloc,
 * cachalloc_free and the hooks of include/cachalloc.h) on the fake
 * libcuda.so.1, with libcachalloc.so dlopen'ed the way
 * torch.cuda.memory.CUDAPluggableAllocator loads it (ctypes.CDLL: RTLD_NOW |
 * RTLD_LOCAL), normally WITHOUT LD_PRELOAD.
 *
 * The program reaches the driver itself through dlopen("libcuda.so.1") and
 * dlsym, as JAX and numba do, so that it can check that a dlopen'ed
 * cachalloc leaves its own allocations alone.
 *
 * Usage: pluggable CASE LIBCACHALLOC [OTHER_COPY]
 *   passive        the program's cuMemAlloc_v2/cuMemFree_v2 and the symbols it
 *                  looks up reach the driver untouched while the pluggable
 *                  ABI serves from the cache; the stats dump counts no hook call
 *   same_stream    a block freed on its stream is reused at once on it; a
 *                  block of another stream's pool is not
 *   record_stream  a block recorded on a busy stream is not reused (even on
 *                  its own stream) until that stream's work completes; also
 *                  through the control API's cachalloc_record_stream
 *   devices        two devices: each allocation runs on its device's primary
 *                  context and leaves the caller's current context as it was;
 *                  frees from threads whose current device differs (or that
 *                  have none); the stats JSON, summary, empty_cache and peaks
 *                  per device
 *   capture        while the stream is captured: allocations bypass the
 *                  cache and are kept for good (a graph replay may write
 *                  them), frees wait until the capture has ended
 *   fraction       cachalloc_set_memory_fraction / the pluggable hook cap what
 *                  the pluggable ABI keeps reserved (empty cache, retry, fail)
 *   hooks          the other hooks: init, empty cache, base allocation,
 *                  record stream of a foreign pointer; argument errors
 *   disabled       a bad CACHALLOC_CONF: the ABI hands out driver memory
 *   preloaded      (run with LD_PRELOAD of the same library) one allocator
 *                  state serves both the hooks and the ABI, counted once
 *   preloaded_copy (LD_PRELOAD of LIBCACHALLOC, OTHER_COPY dlopen'ed) the
 *                  copy forwards to the preloaded library
 *   intercept_off  (LD_PRELOAD and CACHALLOC_INTERCEPT=0) the hooks pass the
 *                  program's allocations to the driver, the ABI still serves
 *   reset          (two devices) device 0's primary context reset behind the
 *                  dlopen'ed library's back (cuDevicePrimaryCtxReset, what
 *                  cudaDeviceReset calls), three ways: allocating right after
 *                  it, after the program retained the primary again (a new
 *                  context id under the same handle), and the control API's
 *                  empty_cache first.  Each allocation afterwards is live memory of the
 *                  new context (the fake knows its address; a memset and copy
 *                  round trip), frees of blocks that died with the old
 *                  context reach nothing, no call touches the dead context
 *                  (the fake counts them), one warning per reset, device
 *                  1's cache untouched */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "check.h"
#include "driver_api.h"
#include "fake_libcuda.h"

#define MiB (1 << 20)

/* The driver, as the program sees it. */
static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuCtxGetCurrent_v4000 get_current;
  PFN_cuCtxGetDevice_v2000 get_device;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuStreamBeginCapture_v10010 begin_capture;
  PFN_cuStreamEndCapture_v10000 end_capture;
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 free;
  PFN_cuGetProcAddress_v12000 get_proc;
  void (*fake_stats)(struct fake_cuda_stats_t*);
  void (*fake_hold)(CUstream, int);
  void* (*fake_raw)(const char*);
} D;

/* libcachalloc.so, as ctypes sees it. */
static struct {
  void* handle;
  void* (*malloc)(ssize_t, int, CUstream);
  void (*free)(void*, ssize_t, int, CUstream);
  void (*init)(int);
  void (*empty)(void);
  void (*fraction)(double, int);
  void* (*base_alloc)(void*, size_t*);
  void (*record)(void*, CUstream);
  int (*empty_cache)(int);
  int (*stats_json)(char*, size_t);
  int (*reset_peak)(int);
  int (*record_stream)(void*, CUstream);
  int (*validate)(char*, size_t);
  int (*summary)(int, char*, size_t);
  int (*set_fraction)(double, int);
  int (*get_fraction)(int, double*);
  int (*base)(void*, void**, size_t*);
} C;

static int load_driver(void) {
  CHECK(driver_api_open("dlsym"));
#define L(field, name) *(void**)&D.field = driver_api_symbol(name)
  L(init, "cuInit");
  L(retain, "cuDevicePrimaryCtxRetain");
  L(set_current, "cuCtxSetCurrent");
  L(get_current, "cuCtxGetCurrent");
  L(get_device, "cuCtxGetDevice");
  L(stream_create, "cuStreamCreate");
  L(stream_destroy, "cuStreamDestroy_v2");
  L(begin_capture, "cuStreamBeginCapture_v2");
  L(end_capture, "cuStreamEndCapture");
  L(alloc, "cuMemAlloc_v2");
  L(free, "cuMemFree_v2");
  L(get_proc, "cuGetProcAddress_v2");
  L(fake_stats, "fake_cuda_stats");
  L(fake_hold, "fake_cuda_hold_stream");
  L(fake_raw, "fake_cuda_lookup_raw");
#undef L
  CHECK(driver_api_complete(&D, sizeof D));
  return 0;
}

static int load_cachalloc(const char* path) {
  C.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);  /* what ctypes.CDLL does */
  if (C.handle == NULL) fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
  CHECK(C.handle != NULL);
#define L(field, name) *(void**)&C.field = dlsym(C.handle, name)
  L(malloc, "cachalloc_malloc");
  L(free, "cachalloc_free");
  L(init, "cachalloc_pluggable_init");
  L(empty, "cachalloc_pluggable_empty_cache");
  L(fraction, "cachalloc_pluggable_set_memory_fraction");
  L(base_alloc, "cachalloc_pluggable_base_alloc");
  L(record, "cachalloc_pluggable_record_stream");
  L(empty_cache, "cachalloc_empty_cache");
  L(stats_json, "cachalloc_stats_json");
  L(reset_peak, "cachalloc_reset_peak_stats");
  L(record_stream, "cachalloc_record_stream");
  L(validate, "cachalloc_validate");
  L(summary, "cachalloc_summary");
  L(set_fraction, "cachalloc_set_memory_fraction");
  L(get_fraction, "cachalloc_get_memory_fraction");
  L(base, "cachalloc_get_base_allocation");
#undef L
  CHECK(driver_api_complete(&C, sizeof C));
  return 0;
}

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  D.fake_stats(&s);
  return s;
}

static CUcontext g_primary[2];

/* cuInit, and device 0's primary context current on this thread. */
static int setup(const char* lib) {
  if (load_driver() || load_cachalloc(lib)) return 1;
  CHECK_CU(D.init(0));
  CHECK_CU(D.retain(&g_primary[0], 0));
  CHECK_CU(D.set_current(g_primary[0]));
  return 0;
}

static CUcontext current(void) {
  CUcontext c = NULL;
  D.get_current(&c);
  return c;
}

static char g_json[1 << 17];

/* The stats JSON of the library whose stats_json is `fn`. */
static int take_json(int (*fn)(char*, size_t)) {
  CHECK_RC(fn(g_json, sizeof g_json), 0);
  return 0;
}

/* The value of "<key>": in the JSON after the device entry of `device`
 * (-1: from the start). */
static long long json_value(int device, const char* key) {
  const char* from = g_json;
  if (device >= 0) {
    char dev[32];
    snprintf(dev, sizeof dev, "{\"device\":%d,", device);
    from = strstr(g_json, dev);
    if (from == NULL) return -1;
  }
  char pattern[128];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char* at = strstr(from, pattern);
  return at == NULL ? -1 : strtoll(at + strlen(pattern), NULL, 10);
}

static int valid(void) {
  char msg[256];
  const int rc = C.validate(msg, sizeof msg);
  if (rc != 0) fprintf(stderr, "cachalloc_validate: %d %s\n", rc, msg);
  CHECK(rc == 0);
  return 0;
}

/* ------------------------------------------------------------------------ */

/* The program's own allocations: n pairs of 1 MiB, each must reach the
 * driver (cachalloc would serve all but the first from its cache). */
static int own_allocations_reach_driver(int n) {
  const struct fake_cuda_stats_t before = stats();
  for (int i = 0; i < n; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(D.alloc(&p, MiB));
    CHECK_CU(D.free(p));
  }
  const struct fake_cuda_stats_t after = stats();
  CHECK(after.mem_alloc - before.mem_alloc == (unsigned long)n);
  CHECK(after.mem_free - before.mem_free == (unsigned long)n);
  return 0;
}

static int passive(const char* lib) {
  if (setup(lib)) return 1;
  /* What the program resolves is the driver's own code. */
  CHECK((void*)D.alloc == D.fake_raw("cuMemAlloc_v2"));
  CHECK((void*)D.free == D.fake_raw("cuMemFree_v2"));
  void* fn = NULL;
  CHECK_CU(D.get_proc("cuMemAlloc", &fn, 12000, 0, NULL));
  CHECK(fn == D.fake_raw("cuMemAlloc_v2"));
  /* ctypes' RTLD_LOCAL: nothing of cachalloc in the global scope. */
  CHECK(dlsym(RTLD_DEFAULT, "cachalloc_malloc") == NULL);
  CHECK(dlsym(RTLD_DEFAULT, "dlsym") != dlsym(C.handle, "dlsym"));
  if (own_allocations_reach_driver(5)) return 1;

  CUstream s = NULL;
  CHECK_CU(D.stream_create(&s, 0));
  const struct fake_cuda_stats_t before = stats();
  for (int i = 0; i < 10; ++i) {
    void* p = C.malloc(MiB, 0, s);
    CHECK(p != NULL);
    C.free(p, MiB, 0, s);
  }
  CHECK(stats().mem_alloc - before.mem_alloc == 1);  /* one segment, then the cache */
  if (own_allocations_reach_driver(5)) return 1;    /* still untouched after first use */
  fn = NULL;
  CHECK_CU(D.get_proc("cuMemAlloc", &fn, 12000, 0, NULL));
  CHECK(fn == D.fake_raw("cuMemAlloc_v2"));

  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(0, "allocation.all.allocated") == 10);
  CHECK(json_value(0, "segment.all.allocated") == 1);
  CHECK(json_value(-1, "cuMemAlloc_v2") == 0);  /* no hook was called */
  CHECK(json_value(-1, "cuMemFree_v2") == 0);
  if (valid()) return 1;
  CHECK_CU(D.stream_destroy(s));
  return 0;
}

static int same_stream(const char* lib) {
  if (setup(lib)) return 1;
  CUstream s1 = NULL, s2 = NULL;
  CHECK_CU(D.stream_create(&s1, 0));
  CHECK_CU(D.stream_create(&s2, 0));
  void* p = C.malloc(MiB, 0, s1);
  CHECK(p != NULL);
  C.free(p, MiB, 0, s1);
  void* q = C.malloc(MiB, 0, s1);
  CHECK(q == p);  /* reused at once on its own stream */
  void* r = C.malloc(MiB, 0, s2);
  CHECK(r != NULL && r != p);  /* p is live; r comes from s2's pool */
  C.free(q, MiB, 0, s1);
  void* t = C.malloc(MiB, 0, s2);
  CHECK(t != p);  /* a block of s1's pool is not handed to s2 */
  /* The legacy stream is a stream of its own. */
  void* u = C.malloc(512, 0, NULL);
  CHECK(u != NULL);
  C.free(u, 512, 0, NULL);
  CHECK(C.malloc(512, 0, NULL) == u);
  C.free(u, 512, 0, NULL);
  C.free(r, MiB, 0, s2);
  C.free(t, MiB, 0, s2);
  CHECK(C.malloc(0, 0, s1) == NULL);
  CHECK(C.malloc(-5, 0, s1) == NULL);
  C.free(NULL, 0, 0, s1);
  if (valid()) return 1;
  return 0;
}

static int record_stream(const char* lib) {
  if (setup(lib)) return 1;
  CUstream s1 = NULL, s2 = NULL;
  CHECK_CU(D.stream_create(&s1, 0));
  CHECK_CU(D.stream_create(&s2, 0));
  for (int via_control = 0; via_control < 2; ++via_control) {
    void* p = C.malloc(MiB, 0, s1);
    CHECK(p != NULL);
    if (via_control)
      CHECK_RC(C.record_stream(p, s2), 0);
    else
      C.record(p, s2);
    D.fake_hold(s2, 1);  /* s2's work (and so the event the free records there) stays incomplete */
    C.free(p, MiB, 0, s1);
    void* q = C.malloc(MiB, 0, s1);
    CHECK(q != NULL && q != p);  /* not even on its own stream before s2's event */
    D.fake_hold(s2, 0);
    void* r = C.malloc(MiB, 0, s1);
    CHECK(r == p);  /* once the event completed, back in s1's pool */
    C.free(q, MiB, 0, s1);
    C.free(r, MiB, 0, s1);
  }
  /* A free naming another stream than the allocation's waits for it too. */
  void* p = C.malloc(MiB, 0, s1);
  D.fake_hold(s2, 1);
  C.free(p, MiB, 0, s2);
  void* q = C.malloc(MiB, 0, s1);
  CHECK(q != p);
  D.fake_hold(s2, 0);
  CHECK(C.malloc(MiB, 0, s1) == p);
  if (valid()) return 1;
  return 0;
}

/* A thread that frees `ptr` (of device `device`) with `ctx` current (NULL:
 * none) and checks its current context is the same afterwards. */
struct free_job {
  void* ptr;
  int device;
  CUcontext ctx;
  int failed;
};

static void* free_thread(void* arg) {
  struct free_job* job = arg;
  D.set_current(job->ctx);
  C.free(job->ptr, MiB, job->device, NULL);
  job->failed = current() != job->ctx;
  return NULL;
}

static int free_from_thread(void* ptr, int device, CUcontext ctx) {
  struct free_job job = {ptr, device, ctx, 1};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, free_thread, &job) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(!job.failed);
  return 0;
}

static int devices(const char* lib) {
  if (setup(lib)) return 1;
  CHECK_CU(D.retain(&g_primary[1], 1));
  /* Current: device 0's primary.  Allocations of both devices. */
  void* a0 = C.malloc(3 * MiB, 0, NULL);
  CHECK(current() == g_primary[0]);
  void* a1 = C.malloc(5 * MiB, 1, NULL);
  CHECK(current() == g_primary[0]);  /* restored */
  void* b1 = C.malloc(4096, 1, NULL);
  CHECK(a0 != NULL && a1 != NULL && b1 != NULL);
  /* No context current at all: still served, and none current after. */
  CHECK_CU(D.set_current(NULL));
  void* c0 = C.malloc(7 * MiB, 0, NULL);
  CHECK(c0 != NULL);
  CHECK(current() == NULL);
  CHECK_CU(D.set_current(g_primary[0]));

  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(0, "allocated_bytes.all.current") == 10 * MiB);
  CHECK(json_value(1, "allocated_bytes.all.current") == 5 * MiB + 4096);
  CHECK(json_value(1, "allocation.all.current") == 2);

  /* Frees from threads whose current device differs, or that have none. */
  if (free_from_thread(a0, 0, g_primary[1])) return 1;
  if (free_from_thread(a1, 1, g_primary[0])) return 1;
  if (free_from_thread(c0, 0, NULL)) return 1;
  /* A free naming the wrong device still finds the owner. */
  if (free_from_thread(b1, 0, g_primary[0])) return 1;
  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(0, "allocated_bytes.all.current") == 0);
  CHECK(json_value(1, "allocated_bytes.all.current") == 0);
  CHECK(json_value(1, "allocated_bytes.all.peak") == 5 * MiB + 4096);

  /* Per device control: peaks, summary, empty cache. */
  CHECK_RC(C.reset_peak(1), 0);
  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(1, "allocated_bytes.all.peak") == 0);
  CHECK(json_value(0, "allocated_bytes.all.peak") == 10 * MiB);
  char table[1 << 14];
  CHECK_RC(C.summary(1, table, sizeof table), 0);
  CHECK(strstr(table, "device ID 1 ") != NULL);
  CHECK(strstr(table, "device ID 0 ") == NULL);
  CHECK(strstr(table, "Allocated memory") != NULL);
  CHECK_RC(C.summary(3, table, sizeof table), 101);
  CHECK_RC(C.summary(-1, table, sizeof table), 0);
  const unsigned long live = stats().live_allocs;
  CHECK_RC(C.empty_cache(1), 0);
  CHECK(stats().live_allocs < live);
  CHECK(current() == g_primary[0]);
  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(1, "reserved_bytes.all.current") == 0);
  CHECK(json_value(0, "reserved_bytes.all.current") > 0);
  CHECK_RC(C.empty_cache(-1), 0);
  CHECK(stats().live_allocs == 0);
  if (valid()) return 1;
  return 0;
}

static int capture(const char* lib) {
  if (setup(lib)) return 1;
  CUstream s = NULL, other = NULL;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.stream_create(&other, 0));
  void* before_capture = C.malloc(MiB, 0, s);
  CHECK(before_capture != NULL);
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  struct fake_cuda_stats_t st0 = stats();
  void* p = C.malloc(MiB, 0, s);
  CHECK(p != NULL);
  CHECK(stats().mem_alloc == st0.mem_alloc + 1);  /* the driver's, not the cache's */
  void* base = NULL;
  CHECK_RC(C.base(p, &base, NULL), 1);            /* not a cachalloc block */
  void* p2 = C.malloc(MiB, 0, s);                 /* freed after the capture */
  CHECK(p2 != NULL);
  C.free(p, MiB, 0, s);
  C.free(before_capture, MiB, 0, s);
  CHECK(stats().mem_free == st0.mem_free);        /* waits for the capture to end */
  CUgraph g = NULL;
  CHECK_CU(D.end_capture(s, &g));
  void* q = C.malloc(MiB, 0, s);                  /* settles the waiting frees */
  CHECK(q == before_capture);
  /* p was allocated during the capture: a replay of the graph may still
   * write it, so it is neither freed nor handed out again. */
  CHECK(stats().mem_free == st0.mem_free);
  void* r = C.malloc(MiB, 0, s);
  CHECK(r != NULL && r != p && r != p2);
  C.free(p2, MiB, 0, s);                          /* after the capture too: kept */
  CHECK(stats().mem_free == st0.mem_free);
  C.free(r, MiB, 0, s);
  C.free(q, MiB, 0, s);
  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(-1, "capture") == 2);
  CHECK(json_value(-1, "foreign_pointer") == 0);
  if (valid()) return 1;
  return 0;
}

static int fraction(const char* lib) {
  if (setup(lib)) return 1;  /* FAKE_CUDA_TOTAL_MB=1024 */
  double f = 0;
  CHECK_RC(C.get_fraction(0, &f), 0);
  CHECK(f == 1.0);
  CHECK_RC(C.set_fraction(0.0, 0), 1);
  CHECK_RC(C.set_fraction(1.5, 0), 1);
  CHECK_RC(C.set_fraction(0.5, -2), 1);
  CHECK_RC(C.set_fraction(0.5, 64), 101);
  CHECK_RC(C.get_fraction(0, NULL), 1);
  CHECK_RC(C.get_fraction(64, &f), 101);
  CHECK_RC(C.set_fraction(0.25, 0), 0);  /* before anything was served */
  CHECK_RC(C.get_fraction(0, &f), 0);
  CHECK(f == 0.25);
  void* a = C.malloc(100 * MiB, 0, NULL);
  void* b = C.malloc(100 * MiB, 0, NULL);
  CHECK(a != NULL && b != NULL);
  void* small = C.malloc(MiB, 0, NULL);
  CHECK(small != NULL);
  C.free(small, MiB, 0, NULL);              /* a cached 2 MiB segment */
  CHECK(C.malloc(100 * MiB, 0, NULL) == NULL);  /* 300 MiB > 256 MiB, even with the cache emptied */
  if (take_json(C.stats_json)) return 1;
  CHECK(json_value(0, "reserved_bytes.all.current") == 200 * MiB);  /* the small segment went back */
  C.free(b, 100 * MiB, 0, NULL);
  void* c = C.malloc(100 * MiB, 0, NULL);
  CHECK(c == b);
  C.fraction(1.0, -1);  /* the pluggable hook: no cap any more */
  CHECK_RC(C.get_fraction(0, &f), 0);
  CHECK(f == 1.0);
  void* d = C.malloc(100 * MiB, 0, NULL);
  CHECK(d != NULL);
  C.fraction(0.5, 0);
  CHECK_RC(C.get_fraction(0, &f), 0);
  CHECK(f == 0.5);
  C.free(a, 0, 0, NULL);
  C.free(c, 0, 0, NULL);
  C.free(d, 0, 0, NULL);
  if (valid()) return 1;
  return 0;
}

static int hooks(const char* lib) {
  if (load_driver() || load_cachalloc(lib)) return 1;
  /* Before anything was served the control functions answer NOT_INITIALIZED. */
  char msg[64];
  CHECK_RC(C.stats_json(msg, sizeof msg), 3);
  CHECK_RC(C.empty_cache(-1), 3);
  C.empty();          /* the reset hook: nothing to do, nothing breaks */
  C.init(2);          /* reads the configuration and loads the driver now */
  C.record(NULL, NULL);
  CHECK_CU(D.init(0));
  CHECK_CU(D.retain(&g_primary[0], 0));
  CHECK_CU(D.set_current(g_primary[0]));

  void* p = C.malloc(3 * MiB + 100, 0, NULL);
  void* q = C.malloc(1000, 0, NULL);
  CHECK(p != NULL && q != NULL);
  /* getBaseAllocation: the segment (dlopen'ed); interior pointers too. */
  size_t size = 0;
  void* base = C.base_alloc((char*)p + 4096, &size);
  CHECK(base != NULL && (char*)base <= (char*)p && size >= 3 * MiB + 100);
  CHECK((char*)p + 3 * MiB + 100 <= (char*)base + size);
  void* b2 = NULL;
  size_t s2 = 0;
  CHECK_RC(C.base(q, &b2, &s2), 0);
  CHECK((char*)b2 <= (char*)q && (char*)q + 1000 <= (char*)b2 + s2);
  CHECK_RC(C.base(q, NULL, &s2), 1);
  CHECK_RC(C.base(NULL, &b2, &s2), 1);
  /* Not a cachalloc pointer: the hook answers ptr itself. */
  CUdeviceptr foreign = 0;
  CHECK_CU(D.alloc(&foreign, 4096));
  size = 77;
  CHECK(C.base_alloc((void*)(uintptr_t)foreign, &size) == (void*)(uintptr_t)foreign);
  CHECK(size == 77);
  C.record((void*)(uintptr_t)foreign, NULL);  /* logged, ignored */
  CHECK_RC(C.record_stream((void*)(uintptr_t)foreign, NULL), 1);
  CHECK_CU(D.free(foreign));

  /* The reset hook empties every device's cache. */
  C.free(p, 0, 0, NULL);
  C.free(q, 0, 0, NULL);
  CHECK(stats().live_allocs > 0);
  C.empty();
  CHECK(stats().live_allocs == 0);
  if (valid()) return 1;
  return 0;
}

/* A bad CACHALLOC_CONF item costs only itself (issue 37): the pluggable
 * ABI serves from the cache as in passive mode, and the control API answers. */
static int bad_conf(const char* lib) {
  if (setup(lib)) return 1;  /* CACHALLOC_CONF=bogus_key:1 */
  const struct fake_cuda_stats_t st0 = stats();
  for (int i = 0; i < 3; ++i) {
    void* p = C.malloc(MiB, 0, NULL);
    CHECK(p != NULL);
    C.free(p, MiB, 0, NULL);
  }
  CHECK(stats().mem_alloc - st0.mem_alloc <= 1);  /* one segment at most, served three times */
  CHECK(stats().mem_free == st0.mem_free);
  static char json[1 << 20];
  CHECK_RC(C.stats_json(json, sizeof json), 0);
  CHECK(strstr(json, "\"config_errors\":[\"CACHALLOC_CONF: unknown key 'bogus_key'") != NULL);
  return 0;
}

/* Both preloaded and plugged in: the hooks serve the program's allocations
 * from the same caches as the ABI, and each allocation is counted once. */
static int preloaded(const char* lib, const char* copy, int intercept) {
  if (setup(copy != NULL ? copy : lib)) return 1;
  int (*global_stats)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_stats_json");
  CHECK(global_stats != NULL);
  if (copy == NULL) CHECK((void*)global_stats == (void*)C.stats_json);  /* dlopen gave the preloaded object */
  else CHECK((void*)global_stats != (void*)C.stats_json);

  const struct fake_cuda_stats_t st0 = stats();
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr p = 0;
    CHECK_CU(D.alloc(&p, MiB));  /* the hook when intercepting (dlsym on libcuda is cachalloc's) */
    CHECK_CU(D.free(p));
  }
  const unsigned long own = stats().mem_alloc - st0.mem_alloc;
  CHECK(intercept ? own <= 1 : own == 3);
  CUstream s = NULL;
  CHECK_CU(D.stream_create(&s, 0));
  void* a = C.malloc(MiB, 0, s);
  void* b = C.malloc(2 * MiB, 0, s);
  CHECK(a != NULL && b != NULL);
  C.free(a, MiB, 0, s);
  C.free(b, 2 * MiB, 0, s);

  if (take_json(global_stats)) return 1;
  CHECK(strstr(g_json, "{\"device\":1,") == NULL);  /* one state for device 0 */
  CHECK(json_value(0, "allocation.all.allocated") == (intercept ? 5 : 2));
  CHECK(json_value(-1, "cuMemAlloc_v2") == 3);  /* counted by the hooks, served or passed on */
  if (copy != NULL) {
    char msg[64];
    CHECK_RC(C.stats_json(msg, sizeof msg), 3);  /* the copy has no state of its own */
  }
  CHECK_CU(D.stream_destroy(s));
  return 0;
}

/* ------------------------------------------------------------------------ */

/* What the reset case asks the driver besides D. */
static struct {
  PFN_cuDevicePrimaryCtxReset_v11000 reset;
  PFN_cuDevicePrimaryCtxGetState_v7000 get_state;
  PFN_cuCtxGetId_v12000 get_id;
  PFN_cuMemGetAddressRange_v3020 address_range;
  PFN_cuMemsetD8_v3020 memset8;
  PFN_cuMemcpyDtoH_v3020 dtoh;
} R;

static unsigned long long ctx_id(CUcontext c) {
  unsigned long long id = 0;
  return R.get_id(c, &id) == CUDA_SUCCESS ? id : 0;
}

/* `p` (of `size` bytes) is memory the fake handed out and still holds (a
 * live cuMemAlloc allocation of a live context covers it), and keeps what
 * is written to it.  Device 0's primary context current. */
static int usable(void* p, size_t size) {
  CHECK(p != NULL);
  CUdeviceptr base = 0;
  size_t range = 0;
  CHECK_CU(R.address_range(&base, &range, (CUdeviceptr)(uintptr_t)p));  /* before touching it */
  CHECK(base <= (CUdeviceptr)(uintptr_t)p && (CUdeviceptr)(uintptr_t)p + size <= base + range);
  static unsigned char buf[MiB];
  const size_t n = size < sizeof buf ? size : sizeof buf;
  CHECK_CU(R.memset8((CUdeviceptr)(uintptr_t)p, 0x5a, n));
  memset(buf, 0, n);
  CHECK_CU(R.dtoh(buf, (CUdeviceptr)(uintptr_t)p, n));
  for (size_t i = 0; i < n; ++i) CHECK(buf[i] == 0x5a);
  return 0;
}

/* How many times `needle` occurs in the file at `path`. */
static int occurrences(const char* path, const char* needle) {
  static char text[1 << 16];
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  const size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  int count = 0;
  for (const char* at = strstr(text, needle); at != NULL; at = strstr(at + 1, needle)) ++count;
  return count;
}

static int reset_rounds(const char* lib) {
  if (setup(lib)) return 1;
#define L(field, name) *(void**)&R.field = driver_api_symbol(name)
  L(reset, "cuDevicePrimaryCtxReset_v2");
  L(get_state, "cuDevicePrimaryCtxGetState");
  L(get_id, "cuCtxGetId");
  L(address_range, "cuMemGetAddressRange_v2");
  L(memset8, "cuMemsetD8_v2");
  L(dtoh, "cuMemcpyDtoH_v2");
#undef L
  CHECK(driver_api_complete(&R, sizeof R));
  CHECK_CU(D.retain(&g_primary[1], 1));

  /* Device 1: a cached block that must survive device 0's resets. */
  void* other = C.malloc(2 * MiB, 1, NULL);
  CHECK(other != NULL);
  C.free(other, 2 * MiB, 1, NULL);

  for (int round = 0; round < 3; ++round) {
    /* Before: a block cached, one still allocated, one in a second segment. */
    void* cached = C.malloc(MiB, 0, NULL);
    void* held = C.malloc(4096, 0, NULL);
    void* big = C.malloc(3 * MiB, 0, NULL);
    if (usable(cached, MiB) || usable(held, 4096) || usable(big, 3 * MiB)) return 1;
    C.free(cached, MiB, 0, NULL);
    C.free(big, 3 * MiB, 0, NULL);
    const unsigned long long id_before = ctx_id(g_primary[0]);
    CHECK(id_before != 0);
    const struct fake_cuda_stats_t st0 = stats();

    CHECK_CU(R.reset(0));  /* cudaDeviceReset: every allocation of device 0 dies */
    unsigned int flags = 0;
    int active = 1;
    CHECK_CU(R.get_state(0, &flags, &active));
    CHECK(active == 0);
    CHECK(stats().live_allocs == 1);  /* device 1's segment only */

    if (round == 0) {
      /* Allocating right away: cachalloc retains the primary again. */
      void* p = C.malloc(MiB, 0, NULL);
      void* q = C.malloc(3 * MiB, 0, NULL);
      if (usable(p, MiB) || usable(q, 3 * MiB)) return 1;
      CHECK(ctx_id(g_primary[0]) != id_before);
      C.free(held, 4096, 0, NULL);  /* died with the old context */
      C.free(p, MiB, 0, NULL);
      C.free(q, 3 * MiB, 0, NULL);
    } else if (round == 1) {
      /* The program (cudart) retains it first: same handle, new id. */
      CUcontext again = NULL;
      CHECK_CU(D.retain(&again, 0));
      CHECK(again == g_primary[0]);
      CHECK(ctx_id(again) != 0 && ctx_id(again) != id_before);
      C.free(held, 4096, 0, NULL);  /* a free first: dropped, nothing reaches the driver */
      CHECK(stats().mem_free == st0.mem_free);
      void* p = C.malloc(4096, 0, NULL);
      if (usable(p, 4096)) return 1;
      C.free(p, 4096, 0, NULL);
    } else {
      /* The control API first (cachalloc.empty_cache(0)): the dead cache
       * is retired, not emptied into the driver, and device 0 has no live
       * cache left to empty. */
      CHECK_RC(C.empty_cache(0), 101);
      CHECK(stats().mem_free == st0.mem_free);
      C.free(held, 4096, 0, NULL);
      void* p = C.malloc(MiB, 0, NULL);
      if (usable(p, MiB)) return 1;
      C.free(p, MiB, 0, NULL);
    }
    const struct fake_cuda_stats_t st = stats();
    CHECK(st.dead_context_calls == 0);
    CHECK(st.mem_free == st0.mem_free);       /* no segment of the dead context was freed */
    CHECK(st.mem_free_invalid == 0);          /* nor any dead pointer handed to the driver */
    CHECK(st.record_on_dead_stream == 0);
    if (valid()) return 1;
  }

  /* Device 1 never noticed: its block comes from its cache. */
  const unsigned long allocs = stats().mem_alloc;
  void* again = C.malloc(2 * MiB, 1, NULL);
  CHECK(again == other);
  CHECK(stats().mem_alloc == allocs);
  C.free(again, 2 * MiB, 1, NULL);

  if (take_json(C.stats_json)) return 1;
  int destroyed = 0;
  for (const char* at = strstr(g_json, "\"context_destroyed\":true"); at != NULL;
       at = strstr(at + 1, "\"context_destroyed\":true"))
    ++destroyed;
  CHECK(destroyed == 3);  /* one retired cache per reset, kept for the report */
  CHECK(stats().dead_context_calls == 0);
  CHECK_RC(C.empty_cache(-1), 0);
  CHECK(stats().live_allocs == 0);
  CHECK(stats().mem_free_invalid == 0);
  return 0;
}

/* The reset case with stderr captured, to count cachalloc's warnings. */
static int reset(const char* lib) {
  char path[] = "/tmp/cachalloc-pluggable-reset-XXXXXX";
  const int fd = mkstemp(path);
  CHECK(fd >= 0);
  fflush(stderr);
  const int saved = dup(2);
  CHECK(saved >= 0 && dup2(fd, 2) == 2);
  int rc = reset_rounds(lib);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  /* What went to stderr, for the test log. */
  FILE* f = fopen(path, "r");
  char line[4096];
  while (f != NULL && fgets(line, sizeof line, f) != NULL) fputs(line, stderr);
  if (f != NULL) fclose(f);
  const int warnings = occurrences(path, "was destroyed behind cachalloc's back");
  unlink(path);
  if (rc != 0) return rc;
  if (warnings != 3) fprintf(stderr, "expected 3 reset warnings, found %d\n", warnings);
  CHECK(warnings == 3);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: pluggable CASE LIBCACHALLOC [OTHER_COPY]\n");
    return 2;
  }
  const char* c = argv[1];
  const char* lib = argv[2];
  int rc;
  if (strcmp(c, "passive") == 0) rc = passive(lib);
  else if (strcmp(c, "same_stream") == 0) rc = same_stream(lib);
  else if (strcmp(c, "record_stream") == 0) rc = record_stream(lib);
  else if (strcmp(c, "devices") == 0) rc = devices(lib);
  else if (strcmp(c, "capture") == 0) rc = capture(lib);
  else if (strcmp(c, "fraction") == 0) rc = fraction(lib);
  else if (strcmp(c, "hooks") == 0) rc = hooks(lib);
  else if (strcmp(c, "bad_conf") == 0) rc = bad_conf(lib);
  else if (strcmp(c, "preloaded") == 0) rc = preloaded(lib, NULL, 1);
  else if (strcmp(c, "preloaded_copy") == 0) rc = argc > 3 ? preloaded(lib, argv[3], 1) : 2;
  else if (strcmp(c, "intercept_off") == 0) rc = preloaded(lib, NULL, 0);
  else if (strcmp(c, "reset") == 0) rc = reset(lib);
  else {
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
  }
  if (rc == 0) printf("pluggable %s: PASS\n", c);
  return rc;
}
