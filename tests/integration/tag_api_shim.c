/* tag_api_shim.c — the control API of tags beyond pause and resume
 * (shim/tag_api.cpp, shim/tms_env.cpp, shim/tms_c_api.cpp) through the preloaded shim on the
 * fake driver, reached through dlsym as a program that does not link
 * cachalloc would (include/cachalloc.h only for the constants and types).
 * Usage: tag_api_shim CASE [DIR]   (LD_PRELOAD=libcachalloc.so; the cases
 * with files take a directory, which they make). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "cachalloc.h"
#include "check.h"
#include "fake_libcuda.h"

#define MiB (1u << 20)
#define API(name) static __typeof__(name)* p_##name
API(cachalloc_set_tag);
API(cachalloc_set_tag_backup);
API(cachalloc_pause);
API(cachalloc_resume);
API(cachalloc_tag_paused);
API(cachalloc_stats_json);
API(cachalloc_set_tag_with_backup);
API(cachalloc_get_tag_with_backup);
API(cachalloc_set_tag_retain_backup);
API(cachalloc_get_tag_retain_backup);
API(cachalloc_get_backup_pointer);
API(cachalloc_set_pause_backup_dir);
API(cachalloc_empty_tag_cache);
API(cachalloc_set_tag_in_pause_all);
API(cachalloc_set_memory_margin);
#define LOOKUP(name) CHECK((p_##name = (__typeof__(name)*)dlsym(RTLD_DEFAULT, #name)) != NULL)

static const char* g_dir = "/tmp";

static int setup(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  LOOKUP(cachalloc_set_tag);
  LOOKUP(cachalloc_set_tag_backup);
  LOOKUP(cachalloc_pause);
  LOOKUP(cachalloc_resume);
  LOOKUP(cachalloc_tag_paused);
  LOOKUP(cachalloc_stats_json);
  LOOKUP(cachalloc_set_tag_with_backup);
  LOOKUP(cachalloc_get_tag_with_backup);
  LOOKUP(cachalloc_set_tag_retain_backup);
  LOOKUP(cachalloc_get_tag_retain_backup);
  LOOKUP(cachalloc_get_backup_pointer);
  LOOKUP(cachalloc_set_pause_backup_dir);
  LOOKUP(cachalloc_empty_tag_cache);
  LOOKUP(cachalloc_set_tag_in_pause_all);
  LOOKUP(cachalloc_set_memory_margin);
  return 0;
}

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  fake_cuda_stats(&s);
  return s;
}

/* Byte i of a block holds (i * 31 + seed) & 0xFF. */
static void fill(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char* v = malloc(n);
  for (size_t i = 0; i < n; ++i) v[i] = (unsigned char)(i * 31 + seed);
  cuMemcpyHtoD_v2(p, v, n);
  free(v);
}

static int host_holds(const unsigned char* v, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i)
    if (v[i] != (unsigned char)(i * 31 + seed)) return 0;
  return 1;
}

static int holds(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char* v = malloc(n);
  cuMemcpyDtoH_v2(v, p, n);
  const int ok = host_holds(v, n, seed);
  free(v);
  return ok;
}

static int json_has(const char* needle) {
  static char buf[1 << 20];
  if (p_cachalloc_stats_json(buf, sizeof buf) != 0) return 0;
  if (strstr(buf, needle) != NULL) return 1;
  fprintf(stderr, "tag_api_shim: '%s' not in %s\n", needle, buf);
  return 0;
}

static void* backup_of(CUdeviceptr p, size_t n) {
  void* host = (void*)1;
  if (p_cachalloc_get_backup_pointer((const void*)(uintptr_t)p, n, &host) != 0) return (void*)2;
  return host;
}

/* Names in the directory starting with `prefix`. */
static int dir_count(const char* dir, const char* prefix) {
  DIR* d = opendir(dir);
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

/* A backup mode per allocation: a variant of the tag, paused and resumed
 * with its name, reported as NAME+MODE. */
static int variants(void) {
  CHECK(setup() == 0);
  char name[64];
  int mode = 7;
  CHECK_RC(p_cachalloc_set_tag_backup("weights", CACHALLOC_BACKUP_HOST), 0);
  CHECK_RC(p_cachalloc_set_tag_with_backup("weights", CACHALLOC_BACKUP_NONE), 0);
  CHECK_RC(p_cachalloc_get_tag_with_backup(name, sizeof name, &mode), 0);
  CHECK(strcmp(name, "weights") == 0 && mode == CACHALLOC_BACKUP_NONE);
  CUdeviceptr scratch = 0, w = 0;
  CHECK_CU(cuMemAlloc_v2(&scratch, 8 * MiB));
  CHECK_RC(p_cachalloc_set_tag_with_backup("weights", CACHALLOC_BACKUP_TAG), 0);  /* the tag's own: host */
  CHECK_RC(p_cachalloc_get_tag_with_backup(name, sizeof name, &mode), 0);
  CHECK(strcmp(name, "weights") == 0 && mode == CACHALLOC_BACKUP_TAG);
  CHECK_CU(cuMemAlloc_v2(&w, 8 * MiB));
  CHECK_RC(p_cachalloc_set_tag_with_backup(NULL, CACHALLOC_TAG_PROCESS), 0);  /* no tag of its own */
  CHECK_RC(p_cachalloc_get_tag_with_backup(name, sizeof name, &mode), 0);
  CHECK(name[0] == '\0' && mode == CACHALLOC_TAG_PROCESS);
  CHECK_RC(p_cachalloc_set_tag_with_backup(NULL, CACHALLOC_BACKUP_TAG), 0);
  CHECK_RC(p_cachalloc_set_tag_with_backup(NULL, CACHALLOC_BACKUP_HOST), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(p_cachalloc_set_tag_with_backup("weights", -3), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(p_cachalloc_set_tag_with_backup("weights", 4), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(p_cachalloc_get_tag_with_backup(name, sizeof name, &mode), 0);
  CHECK(name[0] == '\0' && mode == CACHALLOC_BACKUP_TAG);
  fill(scratch, 8 * MiB, 1);
  fill(w, 8 * MiB, 2);
  const size_t before = stats().live_bytes;
  CHECK_RC(p_cachalloc_pause("weights"), 0);                 /* both */
  CHECK(stats().live_bytes <= before - 16 * MiB);
  CHECK(p_cachalloc_tag_paused("weights") == 1);
  CHECK(json_has("\"weights+none\":{\"paused\":true,\"cpu_backup\":false"));
  CHECK(json_has("\"weights\":{\"paused\":true,\"cpu_backup\":true"));
  CHECK_RC(p_cachalloc_resume("weights"), 0);
  CHECK(p_cachalloc_tag_paused("weights") == 0);
  CHECK(holds(w, 8 * MiB, 2));                               /* backed up */
  CHECK(!holds(scratch, 8 * MiB, 1));                        /* its variant is not */
  CHECK_CU(cuMemFree_v2(w));
  CHECK_CU(cuMemFree_v2(scratch));
  return 0;
}

/* cachalloc keeps host backups past the resume by default; told not to
 * retain them (torch_memory_saver's default), the host backup goes back at
 * the resume; retained, it stays where it was and
 * cachalloc_get_backup_pointer finds the pause's bytes in it. */
static int retain(void) {
  CHECK(setup() == 0);
  CHECK(p_cachalloc_get_tag_retain_backup(NULL) == 1);
  CHECK_RC(p_cachalloc_set_tag_retain_backup(NULL, 0), 0);
  CHECK_RC(p_cachalloc_set_tag_backup("weights", CACHALLOC_BACKUP_HOST), 0);
  CHECK_RC(p_cachalloc_set_tag("weights"), 0);
  CUdeviceptr w = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 6 * MiB));
  CHECK_RC(p_cachalloc_set_tag(NULL), 0);
  fill(w, 6 * MiB, 3);
  CHECK(backup_of(w, 16) == NULL);                           /* running: no backup */
  CHECK_RC(p_cachalloc_pause("weights"), 0);
  CHECK(stats().live_host_allocs == 1);
  unsigned char* host = backup_of(w + 100, 4096);
  CHECK(host != NULL && host != (void*)2);
  CHECK(host_holds(host - 100, 6 * MiB, 3));
  CHECK(backup_of(w + 6 * MiB - 8, 16) == (void*)2);         /* past the block */
  CHECK_RC(p_cachalloc_resume("weights"), 0);
  CHECK(stats().live_host_allocs == 0);                      /* given back */
  CHECK(json_has("\"backup_capacity_bytes\":0,"));
  CHECK(backup_of(w + 100, 4096) == NULL);

  CHECK_RC(p_cachalloc_set_tag_retain_backup(NULL, 1), 0);   /* every tag */
  CHECK(p_cachalloc_get_tag_retain_backup("weights") == 1);
  CHECK_RC(p_cachalloc_set_tag_retain_backup("weights", 2), CUDA_ERROR_INVALID_VALUE);
  CHECK(p_cachalloc_get_tag_retain_backup("bad name!") < 0);
  CHECK_RC(p_cachalloc_pause("weights"), 0);
  host = backup_of(w + 100, 4096);
  CHECK_RC(p_cachalloc_resume("weights"), 0);
  CHECK(backup_of(w + 100, 4096) == host);                   /* retained, same place */
  CHECK(stats().live_host_allocs == 1);
  CHECK(json_has("\"retain_backup\":true,\"backup_retained_bytes\":6291456"));
  CHECK_RC(p_cachalloc_set_tag_retain_backup("weights", 0), 0);
  CHECK(p_cachalloc_get_tag_retain_backup(NULL) == 1);       /* the default stays */
  fill(w, 6 * MiB, 4);
  CHECK_RC(p_cachalloc_pause("weights"), 0);
  CHECK(backup_of(w + 100, 4096) == host);                   /* refilled in place */
  CHECK(host_holds(host - 100, 6 * MiB, 4));
  CHECK_RC(p_cachalloc_resume("weights"), 0);
  CHECK(backup_of(w + 100, 4096) == NULL);
  CHECK(stats().live_host_allocs == 0);
  CHECK(holds(w, 6 * MiB, 4));
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

/* A pageable backup: restored, and unmapped at the resume. */
static int pageable(void) {
  CHECK(setup() == 0);
  CHECK_RC(p_cachalloc_set_tag_retain_backup(NULL, 0), 0);   /* given back at the resume (TMS's default) */
  CHECK_RC(p_cachalloc_set_tag_with_backup("weights", CACHALLOC_BACKUP_PAGEABLE), 0);
  CUdeviceptr w = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 32 * MiB));
  CHECK_RC(p_cachalloc_set_tag(NULL), 0);
  fill(w, 32 * MiB, 5);
  CHECK_RC(p_cachalloc_pause("weights"), 0);
  CHECK(json_has("\"backup_mode\":\"pageable\",\"backup_location\":\"pageable\""));
  CHECK(stats().live_host_allocs == 0);                      /* nothing pinned */
  unsigned char* host = backup_of(w, 32 * MiB);
  CHECK(host != NULL && host != (void*)2 && host_holds(host, 32 * MiB, 5));
  CHECK_RC(p_cachalloc_resume("weights"), 0);
  CHECK(holds(w, 32 * MiB, 5));
  CHECK(msync(host, 32 * MiB, MS_ASYNC) == -1 && errno == ENOMEM);  /* unmapped */
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

/* Named backup files in a directory set at run time (DIR), one per block. */
static int disk_named(void) {
  CHECK(setup() == 0);
  mkdir(g_dir, 0700);
  CHECK_RC(p_cachalloc_set_pause_backup_dir(g_dir, 2), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(p_cachalloc_set_pause_backup_dir(g_dir, 1), 0);
  CHECK_RC(p_cachalloc_set_tag_with_backup("experts", CACHALLOC_BACKUP_DISK), 0);
  CUdeviceptr big = 0, small = 0;
  CHECK_CU(cuMemAlloc_v2(&big, 13 * MiB + 12345));
  CHECK_CU(cuMemAlloc_v2(&small, 7));
  CHECK_RC(p_cachalloc_set_tag(NULL), 0);
  fill(big, 13 * MiB + 12345, 6);
  fill(small, 7, 7);
  for (int cycle = 0; cycle < 2; ++cycle) {
    CHECK_RC(p_cachalloc_pause("experts"), 0);
    CHECK(dir_count(g_dir, "cachalloc-backup-") == 2);
    CHECK(json_has("\"backup_disk_files\":2"));
    CHECK(backup_of(big, 16) == NULL);                       /* no host copy of a disk backup */
    CHECK_RC(p_cachalloc_resume("experts"), 0);
    CHECK(dir_count(g_dir, "cachalloc-backup-") == 0);
    CHECK(holds(big, 13 * MiB + 12345, 6) && holds(small, 7, 7));
  }
  /* Back to the configured directory (the test names one that does not exist). */
  CHECK_RC(p_cachalloc_set_pause_backup_dir(NULL, 0), 0);
  CHECK_RC(p_cachalloc_pause("experts"), CUDA_ERROR_OPERATING_SYSTEM);
  CHECK(holds(big, 13 * MiB + 12345, 6));                  /* the variant runs on, intact */
  CHECK_RC(p_cachalloc_resume("experts"), 0);               /* (the empty named tag did pause) */
  CHECK_CU(cuMemFree_v2(big));
  CHECK_CU(cuMemFree_v2(small));
  return 0;
}

/* A tag that pausing every tag leaves alone, and its cache given back by
 * name (torch_memory_saver's disable()). */
static int scratch_tag(void) {
  CHECK(setup() == 0);
  CHECK_RC(p_cachalloc_set_tag_in_pause_all("scratch", 0), 0);
  CHECK_RC(p_cachalloc_set_tag_in_pause_all("scratch", 3), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(p_cachalloc_set_tag_in_pause_all(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr s1 = 0, s2 = 0, w = 0, u = 0;
  CHECK_RC(p_cachalloc_set_tag("scratch"), 0);
  CHECK_CU(cuMemAlloc_v2(&s1, 40 * MiB));
  CHECK_CU(cuMemAlloc_v2(&s2, 2 * MiB));
  CHECK_RC(p_cachalloc_set_tag("weights"), 0);
  CHECK_CU(cuMemAlloc_v2(&w, 20 * MiB));
  CHECK_RC(p_cachalloc_set_tag(NULL), 0);
  CHECK_CU(cuMemAlloc_v2(&u, 20 * MiB));
  fill(s2, 2 * MiB, 8);
  CHECK_CU(cuMemFree_v2(s1));
  CHECK_CU(cuMemFree_v2(u));                                 /* cached, untagged */
  CHECK_RC(p_cachalloc_pause(NULL), 0);
  CHECK(p_cachalloc_tag_paused("weights") == 1);
  CHECK(p_cachalloc_tag_paused("scratch") == 0);             /* left out */
  CHECK(holds(s2, 2 * MiB, 8));
  const size_t before = stats().live_bytes;
  CHECK_RC(p_cachalloc_empty_tag_cache("scratch"), 0);
  CHECK(stats().live_bytes == before - 40 * MiB);            /* its free pages, nothing else */
  CHECK(holds(s2, 2 * MiB, 8));
  CHECK_RC(p_cachalloc_empty_tag_cache(""), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(p_cachalloc_resume(NULL), 0);
  CHECK_RC(p_cachalloc_pause("scratch"), 0);                 /* by name it pauses */
  CHECK_RC(p_cachalloc_resume("scratch"), 0);
  CHECK_CU(cuMemFree_v2(s2));
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

/* The memory margin of tagged allocations (FAKE_CUDA_TOTAL_MB=1024). */
static int margin(void) {
  CHECK(setup() == 0);
  CHECK_RC(p_cachalloc_set_memory_margin(900u * MiB), 0);
  CUdeviceptr t = 0, u = 0;
  CHECK_RC(p_cachalloc_set_tag("kv_cache"), 0);
  CHECK(cuMemAlloc_v2(&t, 200 * MiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_RC(p_cachalloc_set_tag(NULL), 0);
  CHECK_CU(cuMemAlloc_v2(&u, 200 * MiB));                    /* untagged: no margin */
  CHECK_RC(p_cachalloc_set_memory_margin(0), 0);
  CHECK_RC(p_cachalloc_set_tag("kv_cache"), 0);
  CHECK_CU(cuMemAlloc_v2(&t, 200 * MiB));
  CHECK_RC(p_cachalloc_set_tag(NULL), 0);
  CHECK_CU(cuMemFree_v2(t));
  CHECK_CU(cuMemFree_v2(u));
  return 0;
}

/* torch_memory_saver's environment (the test sets TMS_INIT_ENABLE=1,
 * TMS_INIT_ENABLE_CPU_BACKUP=1, TMS_INIT_CPU_BACKUP_BACKEND=mmap,
 * TMS_RETAIN_CPU_BACKUP=1): allocations outside any tag are "default",
 * backed up in pageable memory, retained after the resume. */
static int tms_env_host(void) {
  CHECK(setup() == 0);
  CHECK(p_cachalloc_get_tag_retain_backup(NULL) == 1);
  char name[64];
  int mode = 7;
  CHECK_RC(p_cachalloc_set_tag("kv"), 0);                    /* a saved state of "no tag of its own" ... */
  CHECK_RC(p_cachalloc_set_tag_with_backup(NULL, CACHALLOC_TAG_PROCESS), 0);
  CHECK_RC(p_cachalloc_get_tag_with_backup(name, sizeof name, &mode), 0);
  CHECK(mode == CACHALLOC_TAG_PROCESS);                      /* ... restored: the process's tag applies */
  CUdeviceptr w = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 4 * MiB));
  fill(w, 4 * MiB, 9);
  CHECK_RC(p_cachalloc_pause(NULL), 0);
  CHECK(json_has("\"default\":{\"paused\":true,\"cpu_backup\":true"));
  CHECK(json_has("\"backup_location\":\"pageable\""));
  void* host = backup_of(w, 4 * MiB);
  CHECK_RC(p_cachalloc_resume(NULL), 0);
  CHECK(host != NULL && backup_of(w, 4 * MiB) == host);      /* retained */
  CHECK(holds(w, 4 * MiB, 9));
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

/* ... with TMS_INIT_ENABLE_DISK_BACKUP=1, TMS_DISK_BACKUP_DIR=DIR/sub (made)
 * and TMS_DISK_BACKUP_CHUNK_MB=1: named files there, 1 MiB staging halves. */
static int tms_env_disk(void) {
  CHECK(setup() == 0);
  char sub[4096];
  snprintf(sub, sizeof sub, "%s/sub", g_dir);
  CUdeviceptr w = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 5 * MiB));
  fill(w, 5 * MiB, 10);
  CHECK_RC(p_cachalloc_pause("default"), 0);
  CHECK(dir_count(sub, "cachalloc-backup-") == 1);
  CHECK(json_has("\"backup_staging_bytes\":2097152"));
  CHECK_RC(p_cachalloc_resume("default"), 0);
  CHECK(dir_count(sub, "cachalloc-backup-") == 0);
  CHECK(holds(w, 5 * MiB, 10));
  CHECK_CU(cuMemFree_v2(w));
  return 0;
}

/* torch_memory_saver's C entry points (shim/tms_c_api.cpp), looked up in
 * the process as TMS's cuda_vmm_granularity test does: allocations inside
 * an interesting region take the region's tag and backup, others none;
 * tms_pause(NULL) pauses every tag and leaves untagged memory alone. */
static int tms_c_api(void) {
  CHECK(setup() == 0);
  void (*set_interesting)(bool) = (void (*)(bool))dlsym(RTLD_DEFAULT, "tms_set_interesting_region");
  bool (*get_interesting)(void) = (bool (*)(void))dlsym(RTLD_DEFAULT, "tms_get_interesting_region");
  void (*set_tag)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "tms_set_current_tag");
  const char* (*get_tag)(void) = (const char* (*)(void))dlsym(RTLD_DEFAULT, "tms_get_current_tag");
  void (*set_cpu)(bool) = (void (*)(bool))dlsym(RTLD_DEFAULT, "tms_set_enable_cpu_backup");
  void (*set_backend)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "tms_set_cpu_backup_backend");
  const char* (*get_backend)(void) = (const char* (*)(void))dlsym(RTLD_DEFAULT, "tms_get_cpu_backup_backend");
  void (*set_retain)(bool) = (void (*)(bool))dlsym(RTLD_DEFAULT, "tms_set_retain_cpu_backup");
  bool (*get_retain)(void) = (bool (*)(void))dlsym(RTLD_DEFAULT, "tms_get_retain_cpu_backup");
  int (*pause)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "tms_pause");
  int (*resume)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "tms_resume");
  uint8_t* (*backup_pointer)(const uint8_t*, uint64_t) =
      (uint8_t* (*)(const uint8_t*, uint64_t))dlsym(RTLD_DEFAULT, "tms_get_cpu_backup_pointer");
  CHECK(set_interesting && get_interesting && set_tag && get_tag && set_cpu && set_backend && get_backend &&
        set_retain && get_retain && pause && resume && backup_pointer);
  CHECK(!get_interesting() && strcmp(get_tag(), "default") == 0 && strcmp(get_backend(), "pinned") == 0);

  CUdeviceptr plain = 0, w = 0, kv = 0;
  CHECK_CU(cuMemAlloc_v2(&plain, 6912));    /* outside a region: untagged (cuda_vmm_granularity's size) */
  set_tag("weights");
  set_cpu(true);
  set_interesting(true);
  CHECK(get_interesting() && strcmp(get_tag(), "weights") == 0);
  CHECK_CU(cuMemAlloc_v2(&w, 30 * MiB));
  set_cpu(false);
  set_tag("kv_cache");
  CHECK_CU(cuMemAlloc_v2(&kv, 20 * MiB));
  set_interesting(false);
  set_backend("bogus");                      /* ignored, as a bad name is (TMS exits) */
  CHECK(strcmp(get_backend(), "pinned") == 0);
  set_retain(true);
  CHECK(get_retain());
  fill(plain, 6912, 1);
  fill(w, 30 * MiB, 2);

  CHECK_RC(pause(NULL), 0);
  CHECK_RC(p_cachalloc_tag_paused("weights"), 1);
  CHECK_RC(p_cachalloc_tag_paused("kv_cache"), 1);
  CHECK(holds(plain, 6912, 1));               /* untagged: never paused */
  const uint8_t* host = backup_pointer((const uint8_t*)(uintptr_t)w, 30 * MiB);
  CHECK(host != NULL && host_holds(host, 30 * MiB, 2));
  CHECK_RC(resume(""), 0);
  CHECK(holds(w, 30 * MiB, 2));
  CHECK(backup_pointer((const uint8_t*)(uintptr_t)w, 30 * MiB) != NULL);  /* retained */
  CHECK_RC(p_cachalloc_tag_paused("weights"), 0);
  CHECK_RC(pause("kv_cache"), 0);
  CHECK_RC(p_cachalloc_tag_paused("weights"), 0);
  CHECK_RC(resume("kv_cache"), 0);
  set_retain(false);
  CHECK_CU(cuMemFree_v2(plain));
  CHECK_CU(cuMemFree_v2(w));
  CHECK_CU(cuMemFree_v2(kv));
  return 0;
}

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "";
  if (argc > 2) g_dir = argv[2];
  if (strcmp(c, "variants") == 0) return variants();
  if (strcmp(c, "retain") == 0) return retain();
  if (strcmp(c, "pageable") == 0) return pageable();
  if (strcmp(c, "disk_named") == 0) return disk_named();
  if (strcmp(c, "scratch_tag") == 0) return scratch_tag();
  if (strcmp(c, "margin") == 0) return margin();
  if (strcmp(c, "tms_env_host") == 0) return tms_env_host();
  if (strcmp(c, "tms_env_disk") == 0) return tms_env_disk();
  if (strcmp(c, "tms_c_api") == 0) return tms_c_api();
  fprintf(stderr, "tag_api_shim: unknown case '%s'\n", c);
  return 2;
}
