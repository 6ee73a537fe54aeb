/* control_api.c — the control API of <cachalloc.h> through the shim, on the
 * fake libcuda.so.1.
 *
 * The program reaches the driver the way JAX and numba do (dlopen of
 * libcuda.so.1, dlsym of each entry point: the shim's dlsym hook hands out
 * its wrappers), so that libcuda is not loaded before the test loads it; it
 * is linked against libcachalloc.so for the control API (C, through the
 * installed header) and also runs with it preloaded.
 *
 * Usage: control_api CASE
 *   not_initialized  before cachalloc serves anything every call answers
 *                    CACHALLOC_ERROR_NOT_INITIALIZED and loads no libcuda
 *   api              arguments, error codes and effects of every function
 *   record_stream    a block recorded on a busy stream is not reused before
 *                    that stream's work completes, and is afterwards
 *   other_context    two devices: a stream of another context is refused,
 *                    empty_cache(1) runs in device 1's context and restores
 *                    the caller's current context
 *   snapshot_configured  cachalloc_snapshot(NULL) writes the configured path
 *   disabled         CACHALLOC_CONF is bad: NOT_INITIALIZED after CUDA use
 *   fork             in a child of fork(): NOT_INITIALIZED
 *   at_exit          from an atexit handler: reports work, driver calls
 *                    answer CACHALLOC_ERROR_DEINITIALIZED */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cachalloc.h"
#include "check.h"
#include "driver_api.h"
#include "fake_libcuda.h"

static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuCtxGetCurrent_v4000 get_current;
  PFN_cuCtxCreate_v3020 ctx_create;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 free;
  PFN_cuMemAllocAsync_v11020 alloc_async;
  PFN_cuMemFreeAsync_v11020 free_async;
  void (*fake_stats)(struct fake_cuda_stats_t*);
  void (*fake_hold)(CUstream, int);
  void* (*fake_raw)(const char*);
} D;

static int load_api(void) {
  if (!driver_api_open("dlsym")) return 0;
#define L(field, name) *(void**)&D.field = driver_api_symbol(name)
  L(init, "cuInit");
  L(retain, "cuDevicePrimaryCtxRetain");
  L(set_current, "cuCtxSetCurrent");
  L(get_current, "cuCtxGetCurrent");
  L(ctx_create, "cuCtxCreate_v2");
  L(stream_create, "cuStreamCreate");
  L(stream_destroy, "cuStreamDestroy_v2");
  L(alloc, "cuMemAlloc_v2");
  L(free, "cuMemFree_v2");
  L(alloc_async, "cuMemAllocAsync");
  L(free_async, "cuMemFreeAsync");
  L(fake_stats, "fake_cuda_stats");
  L(fake_hold, "fake_cuda_hold_stream");
  L(fake_raw, "fake_cuda_lookup_raw");
#undef L
  return driver_api_complete(&D, sizeof D);
}

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  D.fake_stats(&s);
  return s;
}

static CUcontext g_ctx;

static int setup(void) {
  CHECK(load_api());
  CHECK_CU(D.init(0));
  CHECK_CU(D.retain(&g_ctx, 0));
  CHECK_CU(D.set_current(g_ctx));
  return 0;
}

static void* vp(CUdeviceptr p) { return (void*)(uintptr_t)p; }

/* The value of the first "<key>": in `json` after `from`. */
static long long json_value(const char* json, const char* key) {
  char pattern[128];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char* at = strstr(json, pattern);
  return at == NULL ? -1 : strtoll(at + strlen(pattern), NULL, 10);
}

/* Every function answers NOT_INITIALIZED, touching nothing. */
static int all_not_initialized(void) {
  char buf[64] = "x";
  size_t need = 7;
  CHECK_RC(cachalloc_empty_cache(0), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK_RC(cachalloc_empty_cache(-1), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK_RC(cachalloc_stats_json(buf, sizeof buf), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK_RC(cachalloc_stats_json_size(&need), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK(need == 7);
  CHECK_RC(cachalloc_reset_peak_stats(0), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK_RC(cachalloc_snapshot("/nonexistent/x.json"), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK_RC(cachalloc_record_stream((void*)4096, NULL), CACHALLOC_ERROR_NOT_INITIALIZED);
  CHECK_RC(cachalloc_validate(buf, sizeof buf), CACHALLOC_ERROR_NOT_INITIALIZED);
  return 0;
}

static int not_initialized(void) {
  if (all_not_initialized()) return 1;
  /* Nothing loaded libcuda. */
  CHECK(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL);
  /* The symbols are there for ctypes-style lookups. */
  CHECK(dlsym(RTLD_DEFAULT, "cachalloc_validate") == (void*)cachalloc_validate);
  /* A context but no allocation yet: still nothing to act on. */
  if (setup()) return 1;
  if (all_not_initialized()) return 1;
  CUdeviceptr p = 0;
  CHECK_CU(D.alloc(&p, 1000));
  CHECK_RC(cachalloc_validate(NULL, 0), CACHALLOC_SUCCESS);
  CHECK_CU(D.free(p));
  return 0;
}

static int api(void) {
  if (setup()) return 1;
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(D.alloc(&p, 3 << 20));
  CHECK_CU(D.alloc(&q, 4096));

  /* validate */
  char msg[256] = "garbage";
  CHECK_RC(cachalloc_validate(msg, sizeof msg), CACHALLOC_SUCCESS);
  CHECK(msg[0] == '\0');
  CHECK_RC(cachalloc_validate(NULL, 0), CACHALLOC_SUCCESS);
  CHECK_RC(cachalloc_validate(NULL, 5), CACHALLOC_ERROR_INVALID_VALUE);

  /* stats_json: sizes and the too-small answer */
  size_t need = 0;
  CHECK_RC(cachalloc_stats_json_size(NULL), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_RC(cachalloc_stats_json_size(&need), CACHALLOC_SUCCESS);
  CHECK(need > 100);
  char digits[32];
  CHECK_RC(cachalloc_stats_json(digits, sizeof digits), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK((size_t)strtoull(digits, NULL, 10) == need);
  CHECK_RC(cachalloc_stats_json(NULL, 0), CACHALLOC_ERROR_INVALID_VALUE);
  char* buf = malloc(need);
  CHECK(buf != NULL);
  CHECK_RC(cachalloc_stats_json(buf, need - 1), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_RC(cachalloc_stats_json(buf, need), CACHALLOC_SUCCESS);
  CHECK(strlen(buf) == need - 1);
  CHECK(strncmp(buf, "{\"version\":1,", 13) == 0);
  CHECK(strstr(buf, "\"devices\":[{\"device\":0,") != NULL);
  CHECK(json_value(buf, "allocated_bytes.all.current") >= (3 << 20) + 4096);
  const long long reserved = json_value(buf, "reserved_bytes.all.current");
  CHECK(json_value(buf, "cuMemAlloc_v2") == 2);
  free(buf);

  /* reset_peak_stats: the peak drops to the current value */
  CHECK_CU(D.free(p));
  char big[1 << 16];
  CHECK_RC(cachalloc_stats_json(big, sizeof big), CACHALLOC_SUCCESS);
  const long long peak = json_value(big, "allocated_bytes.all.peak");
  const long long current = json_value(big, "allocated_bytes.all.current");
  CHECK(peak > current);
  CHECK_RC(cachalloc_reset_peak_stats(-2), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_RC(cachalloc_reset_peak_stats(1), CACHALLOC_ERROR_INVALID_DEVICE);
  CHECK_RC(cachalloc_reset_peak_stats(0), CACHALLOC_SUCCESS);
  CHECK_RC(cachalloc_stats_json(big, sizeof big), CACHALLOC_SUCCESS);
  CHECK(json_value(big, "allocated_bytes.all.peak") == current);
  CHECK_RC(cachalloc_reset_peak_stats(-1), CACHALLOC_SUCCESS);

  /* empty_cache: the freed 3 MiB segment goes back to the driver */
  const unsigned long frees_before = stats().mem_free;
  CHECK_RC(cachalloc_empty_cache(-2), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_RC(cachalloc_empty_cache(1), CACHALLOC_ERROR_INVALID_DEVICE);
  CHECK_RC(cachalloc_empty_cache(0), CACHALLOC_SUCCESS);
  CHECK(stats().mem_free > frees_before);
  CHECK_RC(cachalloc_stats_json(big, sizeof big), CACHALLOC_SUCCESS);
  CHECK(json_value(big, "reserved_bytes.all.current") < reserved);
  CHECK_RC(cachalloc_empty_cache(-1), CACHALLOC_SUCCESS);
  CUcontext cur = NULL;
  CHECK_CU(D.get_current(&cur));
  CHECK(cur == g_ctx);

  /* snapshot */
  char dir[] = "/tmp/cachalloc-ctl-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256], expanded[256];
  snprintf(path, sizeof path, "%s/snap-%%p.json", dir);
  snprintf(expanded, sizeof expanded, "%s/snap-%d.json", dir, (int)getpid());
  CHECK_RC(cachalloc_snapshot(path), CACHALLOC_SUCCESS);
  FILE* f = fopen(expanded, "r");
  CHECK(f != NULL);
  size_t n = fread(big, 1, sizeof big - 1, f);
  fclose(f);
  big[n] = '\0';
  CHECK(strstr(big, "\"segments\":[") != NULL);
  CHECK(strstr(big, "\"state\":\"active_allocated\"") != NULL); /* q */
  unlink(expanded);
  snprintf(path, sizeof path, "%s/missing/x.json", dir);
  CHECK_RC(cachalloc_snapshot(path), CACHALLOC_ERROR_OPERATING_SYSTEM);
  CHECK_RC(cachalloc_snapshot(NULL), CACHALLOC_ERROR_INVALID_VALUE); /* no snapshot path configured */
  CHECK_RC(cachalloc_snapshot(""), CACHALLOC_ERROR_INVALID_VALUE);
  rmdir(dir);

  /* record_stream: bad arguments */
  CUstream s;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_RC(cachalloc_record_stream(NULL, s), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_RC(cachalloc_record_stream(vp(q + 512), s), CACHALLOC_ERROR_INVALID_VALUE); /* interior */
  CHECK_RC(cachalloc_record_stream(vp(p), s), CACHALLOC_ERROR_INVALID_VALUE);       /* freed */
  CUdeviceptr foreign = 0;
  PFN_cuMemAlloc_v3020 raw_alloc = (PFN_cuMemAlloc_v3020)D.fake_raw("cuMemAlloc_v2");
  PFN_cuMemFree_v3020 raw_free = (PFN_cuMemFree_v3020)D.fake_raw("cuMemFree_v2");
  CHECK_CU(raw_alloc(&foreign, 4096));
  CHECK_RC(cachalloc_record_stream(vp(foreign), s), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_CU(raw_free(foreign));
  CHECK_RC(cachalloc_record_stream(vp(q), s), CACHALLOC_SUCCESS);
  CHECK_RC(cachalloc_record_stream(vp(q), NULL), CACHALLOC_SUCCESS);
  CHECK_RC(cachalloc_record_stream(vp(q), CU_STREAM_PER_THREAD), CACHALLOC_SUCCESS);
  CHECK_CU(D.free(q));
  CHECK_CU(D.stream_destroy(s));
  CHECK_RC(cachalloc_validate(msg, sizeof msg), CACHALLOC_SUCCESS);
  CHECK(stats().dead_context_calls == 0 && stats().record_on_dead_stream == 0);
  return 0;
}

/* The block's own stream `a` would reuse it at once after the free; the
 * use recorded on busy stream `b` makes it wait. */
static int record_stream(void) {
  if (setup()) return 1;
  CUstream a, b;
  CHECK_CU(D.stream_create(&a, 0));
  CHECK_CU(D.stream_create(&b, 0));
  CUdeviceptr p = 0, q = 0, r = 0;
  /* Without a record: immediate reuse on the same stream. */
  CHECK_CU(D.alloc_async(&p, 8192, a));
  CHECK_CU(D.free_async(p, a));
  CHECK_CU(D.alloc_async(&q, 8192, a));
  CHECK(q == p);
  /* With a record on a busy stream: not before b's work completes. */
  D.fake_hold(b, 1);
  CHECK_RC(cachalloc_record_stream(vp(q), b), CACHALLOC_SUCCESS);
  CHECK_CU(D.free_async(q, a));
  CHECK_CU(D.alloc_async(&r, 8192, a));
  CHECK(r != q);
  D.fake_hold(b, 0);
  CUdeviceptr again = 0;
  CHECK_CU(D.alloc_async(&again, 8192, a));
  CHECK(again == q);
  CHECK_CU(D.free_async(again, a));
  CHECK_CU(D.free_async(r, a));
  CHECK_CU(D.stream_destroy(a));
  CHECK_CU(D.stream_destroy(b));
  CHECK_RC(cachalloc_validate(NULL, 0), CACHALLOC_SUCCESS);
  CHECK(stats().dead_context_calls == 0 && stats().record_on_dead_stream == 0);
  return 0;
}

static int other_context(void) {
  if (setup()) return 1;
  CUdeviceptr p = 0;
  CHECK_CU(D.alloc(&p, 4096));
  CUcontext other = NULL;
  CHECK_CU(D.ctx_create(&other, 0, 1)); /* current now */
  CHECK_CU(D.set_current(g_ctx));
  CHECK_RC(cachalloc_empty_cache(1), CACHALLOC_ERROR_INVALID_DEVICE); /* cachalloc has not seen it yet */
  CHECK_CU(D.set_current(other));
  CUstream s_other;
  CHECK_CU(D.stream_create(&s_other, 0));
  CHECK_CU(D.set_current(g_ctx));
  CHECK_RC(cachalloc_record_stream(vp(p), s_other), CACHALLOC_ERROR_INVALID_VALUE);
  CHECK_CU(D.set_current(other));
  CUdeviceptr x = 0;
  CHECK_CU(D.alloc(&x, 1 << 20));
  CHECK_CU(D.free(x));
  CHECK_CU(D.set_current(g_ctx));
  const unsigned long frees_before = stats().mem_free;
  CHECK_RC(cachalloc_empty_cache(1), CACHALLOC_SUCCESS);
  CHECK(stats().mem_free == frees_before + 1);
  CUcontext cur = NULL;
  CHECK_CU(D.get_current(&cur));
  CHECK(cur == g_ctx);
  /* From a thread-less-context state too: no context current at all. */
  CHECK_CU(D.set_current(NULL));
  CHECK_RC(cachalloc_empty_cache(-1), CACHALLOC_SUCCESS);
  CHECK_RC(cachalloc_record_stream(vp(p), NULL), CACHALLOC_SUCCESS);
  CHECK_CU(D.get_current(&cur));
  CHECK(cur == NULL);
  CHECK_CU(D.set_current(other));
  CHECK_CU(D.stream_destroy(s_other));
  CHECK_CU(D.set_current(g_ctx));
  CHECK_CU(D.free(p));
  CHECK_RC(cachalloc_validate(NULL, 0), CACHALLOC_SUCCESS);
  CHECK(stats().dead_context_calls == 0 && stats().record_on_dead_stream == 0);
  return 0;
}

static int snapshot_configured(void) {
  char dir[] = "/tmp/cachalloc-ctl-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char conf[256], path[256];
  snprintf(conf, sizeof conf, "snapshot:%s/conf-%%p.json", dir);
  snprintf(path, sizeof path, "%s/conf-%d.json", dir, (int)getpid());
  setenv("CACHALLOC_CONF", conf, 1); /* read at the first CUDA call */
  if (setup()) return 1;
  CUdeviceptr p = 0;
  CHECK_CU(D.alloc(&p, 4096));
  CHECK_RC(cachalloc_snapshot(NULL), CACHALLOC_SUCCESS);
  struct stat st;
  CHECK(stat(path, &st) == 0 && st.st_size > 0);
  CHECK_CU(D.free(p));
  unlink(path);
  rmdir(dir);
  fflush(stdout);
  _exit(0); /* no exit reports: the snapshot would be written again */
}

/* A bad CACHALLOC_CONF item costs only itself (issue 37): the cache
 * serves and the control API answers. */
static int bad_conf(void) {
  if (setup()) return 1;
  CUdeviceptr p = 0;
  CHECK_CU(D.alloc(&p, 4096));
  CHECK_RC(cachalloc_validate(NULL, 0), CACHALLOC_SUCCESS);
  size_t need = 0;
  CHECK_RC(cachalloc_stats_json_size(&need), CACHALLOC_SUCCESS);
  CHECK(need > 0);
  CHECK_CU(D.free(p));
  return 0;
}

static int fork_child(void) {
  if (setup()) return 1;
  CUdeviceptr p = 0;
  CHECK_CU(D.alloc(&p, 4096));
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) _exit(all_not_initialized());
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_RC(cachalloc_validate(NULL, 0), CACHALLOC_SUCCESS);
  CHECK_CU(D.free(p));
  return 0;
}

/* Registered before the first CUDA call, so it runs after the shim's own
 * exit handler (atexit runs handlers in reverse order). */
static CUdeviceptr g_exit_block;
static void exit_handler(void) {
  char buf[1 << 15];
  int bad = 0;
  bad |= cachalloc_stats_json(buf, sizeof buf) != CACHALLOC_SUCCESS;
  bad |= cachalloc_validate(NULL, 0) != CACHALLOC_SUCCESS;
  bad |= cachalloc_reset_peak_stats(0) != CACHALLOC_SUCCESS;
  bad |= cachalloc_empty_cache(0) != CACHALLOC_ERROR_DEINITIALIZED;
  bad |= cachalloc_record_stream(vp(g_exit_block), NULL) != CACHALLOC_ERROR_DEINITIALIZED;
  if (bad) {
    fprintf(stderr, "at_exit: unexpected answers from the control API while exiting\n");
    _exit(1);
  }
}

static int at_exit(void) {
  atexit(exit_handler);
  if (setup()) return 1;
  CHECK_CU(D.alloc(&g_exit_block, 4096));
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: control_api CASE\n");
    return 2;
  }
  const char* c = argv[1];
  if (strcmp(c, "not_initialized") == 0) return not_initialized();
  if (strcmp(c, "api") == 0) return api();
  if (strcmp(c, "record_stream") == 0) return record_stream();
  if (strcmp(c, "other_context") == 0) return other_context();
  if (strcmp(c, "snapshot_configured") == 0) return snapshot_configured();
  if (strcmp(c, "bad_conf") == 0) return bad_conf();
  if (strcmp(c, "fork") == 0) return fork_child();
  if (strcmp(c, "at_exit") == 0) return at_exit();
  fprintf(stderr, "unknown case %s\n", c);
  return 2;
}
