/* pause_shim.c — tags, pause and resume through the preloaded shim on the
 * fake driver (whose VM mappings are real memory: a paused page faults).
 * Usage: pause_shim CASE   (cases below; LD_PRELOAD=libcachalloc.so).
 * The control API is reached through dlsym, as a program that does not link
 * cachalloc would. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fake_libcuda.h"

typedef int (*tag_fn)(const char*);
static tag_fn set_tag, pause_tag, resume_tag, tag_paused;
static int (*set_backup)(const char*, int);
static int (*get_tag)(char*, size_t);

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  fake_cuda_stats(&s);
  return s;
}

static int setup(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  set_tag = (tag_fn)dlsym(RTLD_DEFAULT, "cachalloc_set_tag");
  pause_tag = (tag_fn)dlsym(RTLD_DEFAULT, "cachalloc_pause");
  resume_tag = (tag_fn)dlsym(RTLD_DEFAULT, "cachalloc_resume");
  tag_paused = (tag_fn)dlsym(RTLD_DEFAULT, "cachalloc_tag_paused");
  set_backup = (int (*)(const char*, int))dlsym(RTLD_DEFAULT, "cachalloc_set_tag_backup");
  get_tag = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_get_tag");
  CHECK(set_tag && pause_tag && resume_tag && tag_paused && set_backup && get_tag);
  return 0;
}

/* Byte i of a block holds (i * 31 + seed) & 0xFF, a pattern of period 256,
 * written and compared a period at a time: byte loops over 70 MiB, 40 times,
 * passed the test's time limit under ThreadSanitizer. */
static void period(unsigned char t[256], unsigned seed) {
  for (size_t i = 0; i < 256; ++i) t[i] = (unsigned char)(i * 31 + seed);
}

static void fill(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char t[256];
  period(t, seed);
  unsigned char* v = malloc(n);
  for (size_t i = 0; i < n; i += 256) memcpy(v + i, t, n - i < 256 ? n - i : 256);
  cuMemcpyHtoD_v2(p, v, n);
  free(v);
}

static int holds(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char t[256];
  period(t, seed);
  unsigned char* v = malloc(n);
  cuMemcpyDtoH_v2(v, p, n);
  int ok = 1;
  for (size_t i = 0; i < n && ok; i += 256) ok = memcmp(v + i, t, n - i < 256 ? n - i : 256) == 0;
  free(v);
  return ok;
}

/* The whole cycle: tags, pause (pages gone), malloc refused, free while
 * paused, resume at the same addresses with the backup restored. */
static int cycle(void) {
  CHECK(setup() == 0);
  char name[64];
  CHECK_RC(set_tag("bad name!"), 1);
  CHECK_RC(set_backup("weights", 1), 0);
  CHECK_RC(set_tag("weights"), 0);
  CHECK_RC(get_tag(name, sizeof name), 0);
  CHECK(strcmp(name, "weights") == 0);
  CUdeviceptr w = 0, w2 = 0, k = 0, k2 = 0, u = 0, extra = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 30u << 20));
  CHECK_CU(cuMemAlloc_v2(&w2, 5000));
  CHECK_RC(set_tag("kv_cache"), 0);
  CHECK_CU(cuMemAlloc_v2(&k, 40u << 20));
  CHECK_CU(cuMemAlloc_v2(&k2, 8u << 20));
  CHECK_RC(set_tag(NULL), 0);
  CHECK_RC(get_tag(name, sizeof name), 0);
  CHECK(name[0] == '\0');
  CHECK_CU(cuMemAlloc_v2(&u, 1000));
  fill(w, 30u << 20, 1);
  fill(w2, 5000, 2);
  fill(u, 1000, 3);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange_v2(&base, &size, w + 100));
  CHECK(base == w && size == (30u << 20));

  CUipcMemHandle ipc;
  CHECK(cuIpcGetMemHandle(&ipc, w) == CUDA_ERROR_INVALID_VALUE); /* tagged: cuMemMap'ed, as the driver refuses */
  const size_t before = stats().live_bytes;
  CHECK_RC(pause_tag("kv_cache"), 0);
  CHECK_RC(pause_tag("weights"), 0);
  CHECK_RC(pause_tag(NULL), 0);            /* already paused: a no-op */
  CHECK(tag_paused("weights") == 1 && tag_paused("kv_cache") == 1);
  const struct fake_cuda_stats_t p = stats();
  CHECK(p.live_bytes < before - (70u << 20)); /* the tags' pages went back */
  CHECK(fake_cuda_vm_access(w, 0) == -1);   /* unmapped, the address still ours */
  CHECK(holds(u, 1000, 3));                 /* untagged memory untouched */

  CHECK_RC(set_tag("weights"), 0);
  CHECK(cuMemAlloc_v2(&extra, 1000) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_RC(set_tag(NULL), 0);
  CHECK_CU(cuMemFree_v2(k2));               /* freeing paused memory works */
  {  /* per-tag statistics in the JSON dump and the summary table */
    int (*stats_json)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_stats_json");
    int (*summary)(int, char*, size_t) = (int (*)(int, char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_summary");
    static char buf[1 << 20];
    CHECK(stats_json && summary);
    CHECK_RC(stats_json(buf, sizeof buf), 0);
    CHECK(strstr(buf, "\"tags\":{\"weights\":{\"paused\":true,\"cpu_backup\":true") != NULL);
    CHECK(strstr(buf, "\"kv_cache\":{\"paused\":true,\"cpu_backup\":false") != NULL);
    CHECK(strstr(buf, "\"num_pauses\":1") != NULL);
    CHECK_RC(summary(0, buf, sizeof buf), 0);
    CHECK(strstr(buf, "Tags of device 0") != NULL && strstr(buf, "weights") != NULL);
  }

  CHECK_RC(resume_tag(NULL), 0);
  CHECK_RC(resume_tag("weights"), 0);       /* a no-op */
  CHECK(tag_paused("weights") == 0);
  CHECK(holds(w, 30u << 20, 1));            /* same address, contents restored */
  CHECK(holds(w2, 5000, 2));
  fill(k, 40u << 20, 4);                    /* kv_cache: new pages, usable */
  CHECK(holds(k, 40u << 20, 4));
  CHECK_CU(cuMemGetAddressRange_v2(&base, &size, w + 100));
  CHECK(base == w && size == (30u << 20));
  CHECK_CU(cuMemFree_v2(w));
  CHECK_CU(cuMemFree_v2(w2));
  CHECK_CU(cuMemFree_v2(k));
  CHECK_CU(cuMemFree_v2(u));
  return 0;
}

/* cuMemCreate out of memory during resume: an error, the tag stays paused,
 * a later resume works and restores the backup. */
static int resume_oom(void) {
  CHECK(setup() == 0);
  CHECK_RC(set_backup("weights", 1), 0);
  CHECK_RC(set_tag("weights"), 0);
  CUdeviceptr w = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 50u << 20));
  CHECK_RC(set_tag(NULL), 0);
  fill(w, 50u << 20, 5);
  CHECK_RC(pause_tag("weights"), 0);
  fake_cuda_fail("cuMemCreate", 1, -1, CUDA_ERROR_OUT_OF_MEMORY); /* the retry after the cache release fails too */
  CHECK_RC(resume_tag("weights"), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(tag_paused("weights") == 1);
  CHECK(stats().live_vm_handles == 0);      /* the page mapped before the failure went back */
  fake_cuda_fail_reset();
  CHECK_RC(resume_tag("weights"), 0);
  CHECK(holds(w, 50u << 20, 5));
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

/* A paused tag's memory under the fake's random failures of every VM call:
 * each pause/resume either succeeds or leaves a state the next call
 * finishes; the backup always comes back. */
static int random_faults(void) {
  CHECK(setup() == 0);
  CHECK_RC(set_backup("weights", 1), 0);
  CHECK_RC(set_tag("weights"), 0);
  CUdeviceptr w = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 70u << 20));
  CHECK_RC(set_tag(NULL), 0);
  fill(w, 70u << 20, 6);
  for (int i = 0; i < 40; ++i) {
    char spec[96];
    snprintf(spec, sizeof spec, "%d:200:cuMemCreate,cuMemMap,cuMemSetAccess,cuCtxSynchronize,cuMemHostAlloc", i + 1);
    CHECK(fake_cuda_fail_random(spec) == 0);
    pause_tag("weights");
    resume_tag("weights");
    fake_cuda_fail_reset();
    if (tag_paused("weights") == 1) CHECK_RC(resume_tag("weights"), 0);
    CHECK(holds(w, 70u << 20, 6));
  }
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "";
  if (strcmp(c, "cycle") == 0) return cycle();
  if (strcmp(c, "resume_oom") == 0) return resume_oom();
  if (strcmp(c, "random_faults") == 0) return random_faults();
  fprintf(stderr, "pause_shim: unknown case '%s'\n", c);
  return 2;
}
