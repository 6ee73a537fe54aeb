/* pause_shim.c — tags, pause and resume through the preloaded shim on the
 * fake driver (whose VM mappings are real memory: a paused page faults).
 * Usage: pause_shim CASE [DIR]   (cases below; LD_PRELOAD=libcachalloc.so;
 * the disk_* cases take the directory that CACHALLOC_CONF's pause_backup_dir
 * names, and make it).
 * The control API is reached through dlsym, as a program that does not link
 * cachalloc would. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

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
 * a later resume works and restores the backup.  The resume maps two runs
 * (the page of a block freed while paused splits the tag's pages), and the
 * second fails: the first goes back. */
static int resume_oom(void) {
  CHECK(setup() == 0);
  CHECK_RC(set_backup("weights", 1), 0);
  CHECK_RC(set_tag("weights"), 0);
  CUdeviceptr w = 0, gap = 0, w2 = 0;
  CHECK_CU(cuMemAlloc_v2(&w, 60u << 20));   /* whole 20 MiB pages each */
  CHECK_CU(cuMemAlloc_v2(&gap, 20u << 20));
  CHECK_CU(cuMemAlloc_v2(&w2, 40u << 20));
  CHECK_RC(set_tag(NULL), 0);
  fill(w, 60u << 20, 5);
  fill(w2, 40u << 20, 6);
  CHECK_RC(pause_tag("weights"), 0);
  CHECK_CU(cuMemFree_v2(gap));
  fake_cuda_fail("cuMemCreate", 1, -1, CUDA_ERROR_OUT_OF_MEMORY); /* the retry after the cache release fails too */
  CHECK_RC(resume_tag("weights"), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(tag_paused("weights") == 1);
  CHECK(stats().live_vm_handles == 0);      /* the run mapped before the failure went back */
  fake_cuda_fail_reset();
  CHECK_RC(resume_tag("weights"), 0);
  CHECK(holds(w, 60u << 20, 5));
  CHECK(holds(w2, 40u << 20, 6));
  CHECK_CU(cuMemFree_v2(w));
  CHECK_CU(cuMemFree_v2(w2));
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

/* ---- disk backups (CACHALLOC_BACKUP_DISK = 2) ---- */

static const char* g_dir;

/* Names visible in the backup directory. */
static int dir_entries(void) {
  DIR* d = opendir(g_dir);
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

/* The descriptor (-1: none; -2: several) this process holds on a file of
 * the backup directory: a backup file has no name, yet /proc shows it
 * there ("DIR/#123 (deleted)"). */
static int backup_fd(void) {
  int found = -1;
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -3;
  char prefix[4096];
  snprintf(prefix, sizeof prefix, "%s/", g_dir);
  for (struct dirent* e; (e = readdir(d)) != NULL;) {
    char link[300], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    const ssize_t len = readlink(link, target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (strncmp(target, prefix, strlen(prefix)) == 0) found = found == -1 ? atoi(e->d_name) : -2;
  }
  closedir(d);
  return found;
}

static int json_has(const char* needle) {
  int (*stats_json)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_stats_json");
  static char buf[1 << 20];
  if (stats_json == NULL || stats_json(buf, sizeof buf) != 0) return 0;
  if (strstr(buf, needle) != NULL) return 1;
  fprintf(stderr, "pause_shim: '%s' not in %s\n", needle, buf);
  return 0;
}

#define BIG (136u << 20) /* more than both 64 MiB staging halves together */
#define SMALL_BLOCKS 200

struct disk_tag {
  CUdeviceptr big, small[SMALL_BLOCKS];
};

static size_t small_size(int i) { return 700 + 131 * (size_t)i; }

static int disk_setup(struct disk_tag* t) {
  CHECK(setup() == 0);
  mkdir(g_dir, 0700);
  CHECK(dir_entries() == 0);
  CHECK_RC(set_backup("weights", 2), 0);
  CHECK_RC(set_backup("weights", 4), CUDA_ERROR_INVALID_VALUE); /* no such mode (3: pageable) */
  CHECK_RC(set_tag("weights"), 0);
  CHECK_CU(cuMemAlloc_v2(&t->big, BIG));
  for (int i = 0; i < SMALL_BLOCKS; ++i) CHECK_CU(cuMemAlloc_v2(&t->small[i], small_size(i)));
  CHECK_RC(set_tag(NULL), 0);
  return 0;
}

static void disk_fill(const struct disk_tag* t, unsigned seed) {
  fill(t->big, BIG, seed);
  for (int i = 0; i < SMALL_BLOCKS; ++i) fill(t->small[i], small_size(i), seed + 1 + (unsigned)i);
}

static int disk_holds(const struct disk_tag* t, unsigned seed) {
  if (!holds(t->big, BIG, seed)) return 0;
  for (int i = 0; i < SMALL_BLOCKS; ++i)
    if (!holds(t->small[i], small_size(i), seed + 1 + (unsigned)i)) return 0;
  return 1;
}

static int disk_free(const struct disk_tag* t) {
  CHECK_CU(cuMemFree_v2(t->big));
  for (int i = 0; i < SMALL_BLOCKS; ++i) CHECK_CU(cuMemFree_v2(t->small[i]));
  return 0;
}

/* Several cycles through a file: contents bit for bit, the file in the
 * directory asked for but nameless, gone at the resume; host memory: the
 * staging halves only, whatever the tag's size. */
static int disk_cycle(void) {
  struct disk_tag t;
  CHECK(disk_setup(&t) == 0);
  for (unsigned cycle = 0; cycle < 3; ++cycle) {
    disk_fill(&t, 10 * cycle);
    const size_t before = stats().live_bytes;
    CHECK_RC(pause_tag("weights"), 0);
    CHECK(tag_paused("weights") == 1);
    CHECK(stats().live_bytes <= before - BIG);   /* the pages went back */
    CHECK(fake_cuda_vm_access(t.big, 0) == -1);
    CHECK(backup_fd() >= 0);                     /* one file, in the directory ... */
    CHECK(dir_entries() == 0);                   /* ... with no name */
    CHECK(json_has("\"backup_mode\":\"disk\",\"backup_location\":\"disk\""));
    CHECK(json_has("\"backup_capacity_bytes\":0,"));          /* no host buffer of the tag's size */
    CHECK(json_has("\"backup_staging_bytes\":134217728"));    /* two halves of 64 MiB */
    CHECK(stats().live_host_allocs == 1);                     /* the staging, that is all */
    CHECK_RC(resume_tag("weights"), 0);
    CHECK(disk_holds(&t, 10 * cycle));
    CHECK(backup_fd() == -1);                    /* the file went at the resume */
    CHECK(json_has("\"backup_location\":\"none\",\"backup_bytes\":0,"));
  }
  CHECK(dir_entries() == 0);
  return disk_free(&t);
}

/* A real write failure: the file size limit (RLIMIT_FSIZE) stops the file
 * at 16 MiB, as a full disk would; SIGXFSZ keeps its default action (kill
 * the process): cachalloc must not let it through.  The pause fails with
 * CUDA_ERROR_OPERATING_SYSTEM, the tag runs on with its contents, the file
 * is gone; with the limit lifted, a retry works. */
static int disk_write_fail(void) {
  struct disk_tag t;
  CHECK(disk_setup(&t) == 0);
  disk_fill(&t, 3);
  /* The pinned staging cannot be had: the pause fails, nothing changed. */
  fake_cuda_fail("cuMemHostAlloc", 0, 1, CUDA_SUCCESS);
  CHECK_RC(pause_tag("weights"), CUDA_ERROR_OUT_OF_MEMORY);
  fake_cuda_fail_reset();
  CHECK(tag_paused("weights") == 0 && backup_fd() == -1);
  CHECK(disk_holds(&t, 3));
  signal(SIGXFSZ, SIG_DFL);
  struct rlimit old, lim;
  CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
  lim = old;
  lim.rlim_cur = 16u << 20;
  CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
  const size_t before = stats().live_bytes;
  CHECK_RC(pause_tag("weights"), CUDA_ERROR_OPERATING_SYSTEM);
  CHECK(tag_paused("weights") == 0);
  CHECK(stats().live_bytes == before);
  CHECK(backup_fd() == -1);
  CHECK(disk_holds(&t, 3));
  CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
  CHECK_RC(pause_tag("weights"), 0);
  CHECK_RC(resume_tag("weights"), 0);
  CHECK(disk_holds(&t, 3));
  CHECK(dir_entries() == 0 && backup_fd() == -1);
  return disk_free(&t);
}

/* A real read failure: the backup file's descriptor is swapped for one
 * that cannot be read (and put back after).  The resume fails with
 * CUDA_ERROR_OPERATING_SYSTEM, the tag stays paused with no page held and
 * its backup kept; the retry restores it. */
static int disk_read_fail(void) {
  struct disk_tag t;
  CHECK(disk_setup(&t) == 0);
  disk_fill(&t, 7);
  CHECK_RC(pause_tag("weights"), 0);
  const size_t paused_live = stats().live_bytes;
  const int fd = backup_fd();
  CHECK(fd >= 0);
  const int saved = dup(fd);
  const int unreadable = open("/dev/null", O_WRONLY | O_CLOEXEC);
  CHECK(saved >= 0 && unreadable >= 0 && dup2(unreadable, fd) == fd);
  CHECK_RC(resume_tag("weights"), CUDA_ERROR_OPERATING_SYSTEM);
  CHECK(tag_paused("weights") == 1);
  CHECK(stats().live_bytes == paused_live);  /* the pages the resume mapped went again */
  CHECK(dup2(saved, fd) == fd);
  close(saved);
  close(unreadable);
  CHECK_RC(resume_tag("weights"), 0);
  CHECK(disk_holds(&t, 7));
  CHECK(backup_fd() == -1);
  CHECK(disk_holds(&t, 7));
  return disk_free(&t);
}

/* A host backup of more than 128 MiB is fresh memory populated by several
 * threads and registered (shim/fresh_pinned.cpp), not cuMemHostAlloc'ed;
 * given back at the resume (unregistered, unmapped) when not retained; a
 * small one stays cuMemHostAlloc's. */
static int big_host_backup(void) {
  CHECK(setup() == 0);
  int (*set_retain)(const char*, int) = (int (*)(const char*, int))dlsym(RTLD_DEFAULT, "cachalloc_set_tag_retain_backup");
  CHECK(set_retain != NULL);
  CHECK_RC(set_backup("weights", 1), 0);
  CHECK_RC(set_backup("small", 1), 0);
  CHECK_RC(set_retain(NULL, 0), 0);
  CUdeviceptr w = 0, s = 0;
  CHECK_RC(set_tag("weights"), 0);
  CHECK_CU(cuMemAlloc_v2(&w, 160u << 20));
  CHECK_RC(set_tag("small"), 0);
  CHECK_CU(cuMemAlloc_v2(&s, 3u << 20));
  CHECK_RC(set_tag(NULL), 0);
  fill(w, 160u << 20, 7);
  fill(s, 3u << 20, 8);
  const struct fake_cuda_stats_t before = stats();
  CHECK_RC(pause_tag("weights"), 0);
  CHECK(stats().host_register == before.host_register + 1);
  CHECK(stats().host_alloc == before.host_alloc);
  CHECK_RC(pause_tag("small"), 0);
  CHECK(stats().host_alloc == before.host_alloc + 1);
  CHECK_RC(resume_tag(NULL), 0);
  CHECK(holds(w, 160u << 20, 7));
  CHECK(holds(s, 3u << 20, 8));
  CHECK(stats().host_unregister == before.host_unregister + 1);  /* not retained: given back */
  CHECK(stats().live_host_allocs == before.live_host_allocs);
  CHECK_RC(set_retain(NULL, 1), 0);
  CHECK_CU(cuMemFree_v2(w));
  CHECK_CU(cuMemFree_v2(s));
  return 0;
}

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "";
  g_dir = argc > 2 ? argv[2] : "/tmp";
  if (strcmp(c, "disk_cycle") == 0) return disk_cycle();
  if (strcmp(c, "disk_write_fail") == 0) return disk_write_fail();
  if (strcmp(c, "disk_read_fail") == 0) return disk_read_fail();
  if (strcmp(c, "big_host_backup") == 0) return big_host_backup();
  if (strcmp(c, "cycle") == 0) return cycle();
  if (strcmp(c, "resume_oom") == 0) return resume_oom();
  if (strcmp(c, "random_faults") == 0) return random_faults();
  fprintf(stderr, "pause_shim: unknown case '%s'\n", c);
  return 2;
}
