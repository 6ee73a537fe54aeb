/* hostile.c — hostile and careless input, and process life (issue 10, items
 * 6 and 7; the outcomes are tabled in docs/RELIABILITY.md).
 *
 * A program linked against libcuda (the fake tests/fake/libcuda.so.1), run
 * with libcachalloc.so preloaded or bare: where the outcome must be the
 * driver's own, meson runs the case both ways against the same assertions.
 * Whether the shim is there is seen, not configured: under the preload
 * cuMemAlloc_v2 is not the fake's own function.
 *
 * Usage: hostile CASE [ARG]
 * Some cases supervise: they never touch CUDA themselves, but run this
 * program again (/proc/self/exe child_*) with a configuration, capture its
 * stdout and stderr, and check its exit status, its output and the files it
 * left.  Exit 0 pass, 77 skip, anything else fail (the reason on stderr). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "fake_libcuda.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static const char* g_case = "?";
static char* g_self; /* argv[0] */

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "[hostile %s%s] %s:%d: check failed: %s\n", g_case, shim() ? "" : " bare", \
              __FILE__, __LINE__, #cond);                                                       \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)

/* ------------------------------------------------------------------ helpers */

/* cachalloc is preloaded: the program's cuMemAlloc_v2 is not the fake's. */
static int shim(void) {
  static int known = -1;
  if (known < 0) known = (void*)cuMemAlloc_v2 != fake_cuda_lookup_raw("cuMemAlloc_v2");
  return known;
}

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  fake_cuda_stats(&s);
  return s;
}

static CUcontext g_primary;

/* cuInit, device 0, its primary context current. */
static int setup(void) {
  CUdevice dev;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&dev, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&g_primary, dev));
  CHECK_CU(cuCtxSetCurrent(g_primary));
  return 0;
}

/* Every byte of [p, p + n) is `value`. */
static int holds(CUdeviceptr p, size_t n, unsigned char value) {
  unsigned char buf[4096];
  for (size_t off = 0; off < n; off += sizeof buf) {
    size_t len = n - off < sizeof buf ? n - off : sizeof buf;
    if (cuMemcpyDtoH_v2(buf, p + off, len) != CUDA_SUCCESS) return 0;
    for (size_t i = 0; i < len; ++i)
      if (buf[i] != value) return 0;
  }
  return 1;
}

static char g_dir[64]; /* a scratch directory, removed at exit */
static pid_t g_dir_owner;

static void remove_dir(void) {
  if (g_dir[0] == '\0' || getpid() != g_dir_owner) return; /* not from a fork child */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", g_dir, g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* Registered before any CUDA call, so it runs after cachalloc's exit
 * reports (atexit handlers run in reverse order). */
static int make_dir(void) {
  strcpy(g_dir, "/tmp/cachalloc-hostile-XXXXXX");
  CHECK(mkdtemp(g_dir) != NULL);
  g_dir_owner = getpid();
  atexit(remove_dir);
  return 0;
}

static int exists(const char* path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* The whole file in a malloc'ed string ("" if missing). */
static char* slurp(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  size_t cap = 1 << 16, n = 0;
  char* buf = malloc(cap + 1);
  if (f != NULL) {
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
      n += got;
      if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
  }
  buf[n] = '\0';
  if (size != NULL) *size = n;
  return buf;
}

static int count_of(const char* text, const char* needle) {
  int n = 0;
  for (const char* p = strstr(text, needle); p != NULL; p = strstr(p + 1, needle)) ++n;
  return n;
}

/* A stats dump that is complete: JSON from '{' to the final '}' with the
 * keys every dump has, and `pid` when not 0. */
static int complete_dump(const char* path, pid_t pid) {
  size_t n = 0;
  char* text = slurp(path, &n);
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = '\0';
  char want[64];
  snprintf(want, sizeof want, "\"pid\":%d,", (int)pid);
  int ok = n > 2 && text[0] == '{' && text[n - 1] == '}' && strstr(text, "\"devices\":[") != NULL &&
           strstr(text, "\"interposer\":") != NULL && (pid == 0 || strstr(text, want) != NULL);
  free(text);
  return ok;
}

/* ------------------------------------------------------------ supervision */

struct child_run {
  int status;
  char* out; /* stdout, malloc'ed */
  char* err; /* stderr, malloc'ed */
  size_t err_size;
};

static void free_run(struct child_run* r) {
  free(r->out);
  free(r->err);
}

/* Runs `hostile MODE [ARG]` with CACHALLOC_CONF = conf (unset when NULL)
 * and waits for it. */
static int run_child(const char* mode, const char* arg, const char* conf, struct child_run* r) {
  char out_path[128], err_path[128];
  snprintf(out_path, sizeof out_path, "%s/.child-out", g_dir);
  snprintf(err_path, sizeof err_path, "%s/.child-err", g_dir);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0 || err < 0) _exit(120);
    dup2(out, 1);
    dup2(err, 2);
    if (conf != NULL) setenv("CACHALLOC_CONF", conf, 1);
    else unsetenv("CACHALLOC_CONF");
    execl("/proc/self/exe", g_self, mode, arg, (char*)NULL);
    _exit(121);
  }
  CHECK(waitpid(pid, &r->status, 0) == pid);
  r->out = slurp(out_path, NULL);
  r->err = slurp(err_path, &r->err_size);
  unlink(out_path);
  unlink(err_path);
  return 0;
}

static int exited_with(const struct child_run* r, int code) {
  return WIFEXITED(r->status) && WEXITSTATUS(r->status) == code;
}

#define SHOW_RUN(r)                                                                                   \
  fprintf(stderr, "  child status 0x%x\n  stdout: %.2000s\n  stderr: %.4000s\n", (r).status, (r).out, \
          (r).err)

/* ------------------------------------------------- item 6: hostile input */

/* Double free: CUDA_ERROR_INVALID_VALUE, nothing changes (the driver says
 * the same for its own allocations); under the shim nothing reaches the
 * driver and the cache still serves. */
static int double_free(void) {
  CUdeviceptr p = 0, q = 0, r = 0, a = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 4096));
  CHECK_CU(cuMemAlloc_v2(&q, 4096));
  CHECK_CU(cuMemsetD8_v2(q, 0x11, 4096));
  CHECK_CU(cuMemFree_v2(p));
  struct fake_cuda_stats_t before = stats();
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  /* The stream-ordered free of a freed pointer too. */
  CHECK_CU(cuMemAllocAsync(&a, 8192, NULL));
  CHECK_CU(cuMemFreeAsync(a, NULL));
  CHECK(cuMemFreeAsync(a, NULL) == CUDA_ERROR_INVALID_VALUE);
  if (shim()) {
    struct fake_cuda_stats_t after = stats();
    CHECK(after.mem_free == before.mem_free && after.mem_free_invalid == before.mem_free_invalid);
    CHECK(after.mem_free_async == 0);
  }
  CHECK(holds(q, 4096, 0x11)); /* the live neighbour is intact */
  CHECK_CU(cuMemFree_v2(q));
  unsigned long allocs = stats().mem_alloc;
  CHECK_CU(cuMemAlloc_v2(&r, 4096));
  if (shim()) CHECK(stats().mem_alloc == allocs); /* still served from the cache */
  CHECK_CU(cuMemFree_v2(r));
  return 0;
}

/* A pointer inside a block, past it, or into free space of a segment:
 * CUDA_ERROR_INVALID_VALUE, the block stays allocated and intact. */
static int interior_pointer(void) {
  CUdeviceptr p = 0;
  const size_t n = 10000;
  CHECK_CU(cuMemAlloc_v2(&p, n));
  CHECK_CU(cuMemsetD8_v2(p, 0x22, n));
  struct fake_cuda_stats_t before = stats();
  const size_t offsets[] = {1, 255, 256, 512, 4096, n - 1, n, 10240, 64 * KiB};
  for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; ++i) {
    CHECK(cuMemFree_v2(p + offsets[i]) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFreeAsync(p + offsets[i], NULL) == CUDA_ERROR_INVALID_VALUE);
  }
  if (shim()) CHECK(stats().mem_free_invalid == before.mem_free_invalid); /* refused by cachalloc itself */
  CHECK(holds(p, n, 0x22));
  CHECK_CU(cuMemFree_v2(p));
  CHECK(cuMemFree_v2(p + 512) == CUDA_ERROR_INVALID_VALUE);
  return 0;
}

/* A pointer cachalloc never handed out goes to the driver, whose answer the
 * program gets: a driver allocation is freed, garbage is refused. */
static int foreign_pointer(void) {
  CUresult (*raw_alloc)(CUdeviceptr*, size_t) = (CUresult(*)(CUdeviceptr*, size_t))fake_cuda_lookup_raw("cuMemAlloc_v2");
  CUdeviceptr p = 0;
  CHECK(raw_alloc != NULL);
  CHECK_CU(raw_alloc(&p, 4096));
  struct fake_cuda_stats_t before = stats();
  CHECK_CU(cuMemFree_v2(p));
  CHECK(stats().mem_free == before.mem_free + 1); /* the driver freed it */
  void* host = malloc(4096);
  const CUdeviceptr garbage[] = {0x1000, (CUdeviceptr)(uintptr_t)host, ~(CUdeviceptr)0 - 4095, p};
  for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; ++i) {
    CHECK(cuMemFree_v2(garbage[i]) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFreeAsync(garbage[i], NULL) == CUDA_ERROR_INVALID_VALUE);
  }
  free(host);
  CHECK(stats().mem_free_invalid == before.mem_free_invalid + 8); /* each reached the driver */
  return 0;
}

/* A pointer of another context is freed in its owner (cross-context frees
 * are legal with unified addressing), with any context current or none. */
static int other_context(void) {
  CUresult (*create)(CUcontext*, unsigned int, CUdevice) =
      (CUresult(*)(CUcontext*, unsigned int, CUdevice))fake_cuda_lookup_raw("cuCtxCreate_v2");
  CUcontext c1, c2;
  CUdeviceptr p = 0, q = 0, r = 0;
  CHECK(create != NULL);
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(create(&c2, 0, 0));
  CHECK_CU(cuCtxSetCurrent(c1));
  CHECK_CU(cuMemAlloc_v2(&p, MiB));
  CHECK_CU(cuMemAlloc_v2(&r, MiB));
  CHECK_CU(cuMemsetD8_v2(r, 0x33, MiB));
  CHECK_CU(cuCtxSetCurrent(c2));
  unsigned long frees = stats().mem_free;
  CHECK_CU(cuMemFree_v2(p));
  if (shim()) CHECK(stats().mem_free == frees); /* into c1's cache, not to the driver */
  CHECK_CU(cuCtxSetCurrent(c1));
  unsigned long allocs = stats().mem_alloc;
  CHECK_CU(cuMemAlloc_v2(&q, MiB));
  if (shim()) CHECK(q == p && stats().mem_alloc == allocs);
  CHECK(holds(r, MiB, 0x33)); /* c1's other block untouched */
  /* No context current at all. */
  CHECK_CU(cuCtxSetCurrent(NULL));
  CHECK_CU(cuMemFree_v2(q));
  CHECK_CU(cuMemFreeAsync(r, CU_STREAM_LEGACY));
  CHECK_CU(cuCtxSetCurrent(g_primary));
  return 0;
}

/* A pointer whose context was destroyed: the cache died with the context,
 * so the free is the driver's (which refuses memory it destroyed), and no
 * call ever names the dead context. */
static int destroyed_context(void) {
  CUresult (*create)(CUcontext*, unsigned int, CUdevice) =
      (CUresult(*)(CUcontext*, unsigned int, CUdevice))fake_cuda_lookup_raw("cuCtxCreate_v2");
  CUcontext c1;
  CUdeviceptr p = 0, q = 0;
  CHECK(create != NULL);
  CHECK_CU(create(&c1, 0, 0));
  CHECK_CU(cuMemAlloc_v2(&p, 4096));
  CHECK_CU(cuMemAlloc_v2(&q, 4096));
  CHECK_CU(cuMemFree_v2(q)); /* cached in c1 */
  CHECK_CU(cuCtxDestroy_v2(c1));
  CHECK_CU(cuCtxSetCurrent(g_primary));
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree_v2(q) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAlloc_v2(&p, 4096)); /* the primary context still serves */
  CHECK_CU(cuMemFree_v2(p));
  CHECK(stats().dead_context_calls == 0);
  return 0;
}

/* Frees during a graph capture: a plain free succeeds (cachalloc defers it
 * until the capture ended), a second free is still refused, a stream-ordered
 * free of non-graph memory on the capturing stream is refused as the driver
 * refuses it, and graph allocations pass through. */
static int free_during_capture(void) {
  CUstream s;
  CUgraph g;
  CUdeviceptr p = 0, q = 0, gp = 0;
  CHECK_CU(cuStreamCreate(&s, 0));
  CHECK_CU(cuMemAlloc_v2(&p, MiB));
  CHECK_CU(cuMemAlloc_v2(&q, MiB));
  CHECK_CU(cuMemsetD8_v2(q, 0x44, MiB));
  CHECK_CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  unsigned long records = stats().event_record, syncs = stats().ctx_sync;
  CHECK_CU(cuMemFree_v2(p));
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFreeAsync(q, s) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAllocAsync(&gp, 4096, s)); /* a graph allocation: the driver's */
  CHECK_CU(cuMemFreeAsync(gp, s));
  if (shim()) CHECK(stats().event_record == records && stats().ctx_sync == syncs); /* the capture is intact */
  CHECK_CU(cuStreamEndCapture(s, &g));
  CHECK(holds(q, MiB, 0x44));
  CHECK_CU(cuMemFree_v2(q));
  CHECK(cuMemFree_v2(q) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuStreamDestroy_v2(s));
  return 0;
}

/* Sizes near SIZE_MAX, and sizes whose rounding (to 512 B, to power-of-two
 * divisions, to 2 MiB segments) would overflow: CUDA_ERROR_OUT_OF_MEMORY as
 * the driver answers, *dptr untouched, never a wrap-around to a small block;
 * live memory intact and later allocations work.  Run also with
 * roundup_power2_divisions and expandable segments. */
static int huge_sizes(void) {
  const size_t max = ~(size_t)0;
  size_t total = 0, free_bytes = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
  const size_t sizes[] = {max,
                          max - 1,
                          max - 511,
                          max - 2 * MiB,
                          max - 20 * MiB,
                          (size_t)1 << 63,
                          ((size_t)1 << 63) + 1,
                          max / 2,
                          ((size_t)1 << 62) + 1,
                          (size_t)1 << 62,
                          ((size_t)1 << 62) - 1,
                          (size_t)1 << 40,
                          total + 1,
                          total + 2 * MiB};
  CUdeviceptr live = 0, cached = 0, again = 0;
  CHECK_CU(cuMemAlloc_v2(&live, 3000));
  CHECK_CU(cuMemsetD8_v2(live, 0x55, 3000));
  CHECK_CU(cuMemAlloc_v2(&cached, 1000));
  CHECK_CU(cuMemFree_v2(cached)); /* a cached small block a wrap-around would hand out */
  CUstream s;
  CHECK_CU(cuStreamCreate(&s, 0));
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    CUdeviceptr p = 0xdead000;
    if (cuMemAlloc_v2(&p, sizes[i]) != CUDA_ERROR_OUT_OF_MEMORY || p != 0xdead000) {
      fprintf(stderr, "[hostile huge_sizes] cuMemAlloc_v2 of %zu bytes: not out of memory (p=%#llx)\n", sizes[i],
              (unsigned long long)p);
      return 1;
    }
    CHECK(cuMemAllocAsync(&p, sizes[i], s) == CUDA_ERROR_OUT_OF_MEMORY && p == 0xdead000);
    CHECK(cuMemAllocAsync(&p, sizes[i], NULL) == CUDA_ERROR_OUT_OF_MEMORY && p == 0xdead000);
  }
  CHECK(holds(live, 3000, 0x55));
  CHECK_CU(cuMemAlloc_v2(&again, 1000));
  CHECK_CU(cuMemFree_v2(again));
  CHECK_CU(cuMemFree_v2(live));
  CHECK_CU(cuStreamDestroy_v2(s));
  return 0;
}

/* Size 0 and a NULL result pointer: CUDA_ERROR_INVALID_VALUE. */
static int zero_size(void) {
  CUdeviceptr p = 0xdead000;
  CHECK(cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE && p == 0xdead000);
  CHECK(cuMemAllocAsync(&p, 0, NULL) == CUDA_ERROR_INVALID_VALUE && p == 0xdead000);
  CHECK(cuMemAlloc_v2(NULL, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAllocAsync(NULL, 16, NULL) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree_v2(0));
  CHECK_CU(cuMemFreeAsync(0, NULL));
  return 0;
}

/* ------------------------------------------- configuration (supervised) */

/* child: whatever the configuration, the program's calls succeed; with
 * argv "passthrough" every one reached the driver, with "served" the cache
 * served. */
static int child_conf(const char* expect) {
  CUdeviceptr p = 0, q = 0;
  CHECK(setup() == 0);
  CHECK_CU(cuMemAlloc_v2(&p, 1000));
  CHECK_CU(cuMemFree_v2(p));
  CHECK_CU(cuMemAlloc_v2(&q, 1000));
  CHECK_CU(cuMemFree_v2(q));
  struct fake_cuda_stats_t s = stats();
  if (strcmp(expect, "passthrough") == 0) CHECK(s.mem_alloc == 2 && s.mem_free == 2);
  if (strcmp(expect, "served") == 0) CHECK(s.mem_alloc == 1 && s.mem_free == 0);
  printf("done\n");
  return 0;
}

/* child: CACHALLOC_CONF of 1 MB, set before the first CUDA call (exec
 * refuses an environment string over 128 KiB). */
static int child_huge_conf(const char* kind) {
  const size_t size = (size_t)1 << 20;
  char* text = malloc(size + 64);
  text[0] = '\0';
  if (strcmp(kind, "malformed") == 0) {
    memset(text, 'x', size);  /* one item without a colon */
    text[size] = '\0';
  } else if (strcmp(kind, "unknown_key") == 0) {
    memset(text, 'k', size);
    strcpy(text + size, ":1");
  } else if (strcmp(kind, "long_value") == 0) {
    strcpy(text, "max_split_size_mb:");
    memset(text + 18, '9', size);
    text[18 + size] = '\0';
  } else { /* valid: many items, the last of each key wins */
    size_t n = 0;
    while (n < size) n += (size_t)sprintf(text + n, "max_split_size_mb:64,expandable_segments:false,");
  }
  setenv("CACHALLOC_CONF", text, 1);
  free(text);
  (void)kind;
  return child_conf("served");  /* a bad text costs its own items only (issue 37) */
}

/* One message for a bad configuration (issue 37): one line on stderr
 * naming CACHALLOC_CONF and the reason, saying the item is not applied;
 * cachalloc stays active (the cache serves the program's allocations). */
static int check_bad_conf_run(const struct child_run* r, const char* conf_shown) {
  int ok = exited_with(r, 0) && strcmp(r->out, "done\n") == 0 && r->err_size > 0 && r->err_size < 1500 &&
           strchr(r->err, '\n') == r->err + r->err_size - 1 && strstr(r->err, "CACHALLOC_CONF: ") != NULL &&
           strstr(r->err, "(this item is not applied; the others are)") != NULL &&
           strstr(r->err, "disabled") == NULL;
  if (!ok) {
    fprintf(stderr, "[hostile bad_conf] conf '%.200s':\n", conf_shown);
    SHOW_RUN(*r);
  }
  return ok;
}

static int bad_conf(void) {
  static const char* const confs[] = {
      "bogus_key:1", "max_split_size", "max_split_size_mb", "max_split_size_mb:", "max_split_size_mb:19",
      "max_split_size_mb:-1", "max_split_size_mb:99999999999999999999999999999999", ":", ":::", "[", "]", "[]:[]",
      "roundup_power2_divisions:[1:3]", "roundup_power2_divisions:[256:1,", "roundup_power2_divisions:3",
      "per_process_memory_fraction:0", "per_process_memory_fraction:nan", "per_process_memory_fraction:inf",
      "per_process_memory_fraction:1e400", "per_process_memory_fraction:-0", "garbage_collection_threshold:1",
      "stats:", "snapshot_signal:99", "snapshot_signal:KILL", "trace_max_entries:0",
      "trace_max_entries:99999999999999999999999", "log_level:verbose", "expandable_segments:yes",
      "free_sync:sometimes", "\x01\x02\x03:\x7f", "caf\xc3\xa9:1", "log_level:\x1b" "c", "max_split_size_mb:64,,bogus",
      "free_sync:fence,max_split_size_mb:1",
  };
  CHECK(make_dir() == 0);
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; ++i) {
    struct child_run r;
    CHECK(run_child("child_conf", "served", confs[i], &r) == 0);
    int ok = check_bad_conf_run(&r, confs[i]);
    if (ok && strchr(confs[i], '\x1b') != NULL) ok = strchr(r.err, '\x1b') == NULL; /* escaped, not raw */
    free_run(&r);
    CHECK(ok);
  }
  /* 100 KB through the environment (under exec's 128 KiB limit). */
  char* big = malloc(100001);
  memset(big, 'z', 100000);
  big[100000] = '\0';
  struct child_run r;
  CHECK(run_child("child_conf", "served", big, &r) == 0);
  free(big);
  int ok = check_bad_conf_run(&r, "100 KB of z");
  free_run(&r);
  CHECK(ok);
  /* Empty items are fine: the cache serves, nothing is printed. */
  CHECK(run_child("child_conf", "served", " , ,", &r) == 0);
  ok = exited_with(&r, 0) && r.err_size == 0;
  if (!ok) SHOW_RUN(r);
  free_run(&r);
  CHECK(ok);
  return 0;
}

static int huge_conf(void) {
  CHECK(make_dir() == 0);
  static const char* const kinds[] = {"malformed", "unknown_key", "long_value"};
  for (size_t i = 0; i < 3; ++i) {
    struct child_run r;
    CHECK(run_child("child_huge_conf", kinds[i], NULL, &r) == 0);
    int ok = check_bad_conf_run(&r, kinds[i]) && strstr(r.err, " bytes)") != NULL; /* cut, with the length */
    free_run(&r);
    CHECK(ok);
  }
  struct child_run r;
  CHECK(run_child("child_huge_conf", "valid", NULL, &r) == 0);
  int ok = exited_with(&r, 0) && r.err_size == 0 && strcmp(r.out, "done\n") == 0;
  if (!ok) SHOW_RUN(r);
  free_run(&r);
  CHECK(ok);
  return 0;
}

/* --------------------------------------------- report paths (supervised) */

/* child: a few allocations, "done", then exit(3); with "plant" it first
 * plants symbolic links at the temporary names its stats dump will try
 * (as someone predicting its pid would), pointing at argv's victim. */
static int child_report_exit(const char* arg) {
  CUdeviceptr p[4];
  CHECK(setup() == 0);
  for (int i = 0; i < 4; ++i) CHECK_CU(cuMemAlloc_v2(&p[i], 1000 * (size_t)(i + 1)));
  CHECK_CU(cuMemFree_v2(p[0]));
  if (arg != NULL && strncmp(arg, "plant:", 6) == 0) { /* plant:DIR */
    char victim[256], link[256];
    snprintf(victim, sizeof victim, "%s/victim", arg + 6);
    for (int n = 0; n < 10; ++n) {
      snprintf(link, sizeof link, "%s/.stats.json.tmp.%d.%d", arg + 6, (int)getpid(), n);
      CHECK(symlink(victim, link) == 0);
    }
  }
  printf("done\n");
  fflush(stdout);
  exit(3);
}

/* The run ended as the program ends (status 3, its output intact), with
 * `warnings` lines of "cannot write the <what>" on stderr, each containing
 * `reason`; besides them, at most one line per report from the start-up
 * check of its directory (issue 37). */
static int check_report_run(const struct child_run* r, int warnings, const char* reason) {
  const int early = count_of(r->err, "(checked at start-up; the report at exit will fail unless this changes)");
  int ok = exited_with(r, 3) && strcmp(r->out, "done\n") == 0 &&
           count_of(r->err, "cachalloc: warning: cannot write the ") == warnings && early <= warnings &&
           count_of(r->err, "\n") == warnings + early && (reason == NULL || (count_of(r->err, reason) >= warnings && count_of(r->err, reason) <= warnings + early)) &&
           (warnings == 0 || count_of(r->err, "in CACHALLOC_CONF to a path in an existing, writable directory") ==
                                 warnings);
  if (!ok) {
    fprintf(stderr, "[hostile report_paths] expected %d warning(s) with '%s'\n", warnings, reason ? reason : "");
    SHOW_RUN(*r);
  }
  return ok;
}

static int report_paths(void) {
  char conf[1024], reason[512], path[256], victim[256];
  struct child_run r;
  int ok;
  CHECK(make_dir() == 0);

  /* A missing directory. */
  snprintf(conf, sizeof conf, "stats:%s/missing/stats.json", g_dir);
  snprintf(reason, sizeof reason, "cannot write the stats dump to %s/missing/stats.json: directory %s/missing does not exist.",
           g_dir, g_dir);
  CHECK(run_child("child_report_exit", NULL, conf, &r) == 0);
  ok = check_report_run(&r, 1, reason);
  free_run(&r);
  CHECK(ok);

  /* A file where a directory should be. */
  snprintf(path, sizeof path, "%s/a-file", g_dir);
  fclose(fopen(path, "w"));
  snprintf(conf, sizeof conf, "stats:%s/stats.json,trace:%s/trace.json", path, path);
  snprintf(reason, sizeof reason, "a component of %s is not a directory", path);
  CHECK(run_child("child_report_exit", NULL, conf, &r) == 0);
  ok = check_report_run(&r, 2, reason);
  free_run(&r);
  CHECK(ok);

  /* An unwritable directory: permissions (not for root), and /proc (for anyone). */
  if (geteuid() != 0) {
    snprintf(path, sizeof path, "%s/readonly", g_dir);
    CHECK(mkdir(path, 0500) == 0);
    snprintf(conf, sizeof conf, "stats:%s/stats.json", path);
    snprintf(reason, sizeof reason, "no permission to create a file in directory %s", path);
    CHECK(run_child("child_report_exit", NULL, conf, &r) == 0);
    ok = check_report_run(&r, 1, reason);
    free_run(&r);
    CHECK(ok);
  }
  CHECK(run_child("child_report_exit", NULL, "stats:/proc/cachalloc-stats.json", &r) == 0);
  ok = check_report_run(&r, 1, "cannot write the stats dump to /proc/cachalloc-stats.json: ");
  free_run(&r);
  CHECK(ok);

  /* Symbolic links planted at each report's path, pointing at a file the
   * user owns: never written through, the victim and the links untouched. */
  snprintf(victim, sizeof victim, "%s/victim", g_dir);
  FILE* f = fopen(victim, "w");
  fputs("precious", f);
  fclose(f);
  const char* names[] = {"stats.json", "snap.json", "trace.json"};
  for (int i = 0; i < 3; ++i) {
    snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
    CHECK(symlink(victim, path) == 0);
  }
  snprintf(conf, sizeof conf, "stats:%s/stats.json,snapshot:%s/snap.json,trace:%s/trace.json", g_dir, g_dir, g_dir);
  CHECK(run_child("child_report_exit", NULL, conf, &r) == 0);
  ok = check_report_run(&r, 3, ": it is a symbolic link, and cachalloc never writes through a link");
  free_run(&r);
  CHECK(ok);
  char* content = slurp(victim, NULL);
  ok = strcmp(content, "precious") == 0;
  free(content);
  CHECK(ok);
  for (int i = 0; i < 3; ++i) {
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
    CHECK(lstat(path, &st) == 0 && S_ISLNK(st.st_mode));
    unlink(path);
  }

  /* A dangling link: writing through it would create the file elsewhere. */
  char elsewhere[256];
  snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere.json", g_dir);
  snprintf(path, sizeof path, "%s/stats.json", g_dir);
  CHECK(symlink(elsewhere, path) == 0);
  snprintf(conf, sizeof conf, "stats:%s", path);
  CHECK(run_child("child_report_exit", NULL, conf, &r) == 0);
  ok = check_report_run(&r, 1, "it is a symbolic link");
  free_run(&r);
  CHECK(ok);
  CHECK(!exists(elsewhere));
  unlink(path);

  /* Links planted at the temporary names: skipped, the dump is written
   * anyway (a fresh name), the victim untouched. */
  char plant[300];
  snprintf(plant, sizeof plant, "plant:%s", g_dir);
  snprintf(conf, sizeof conf, "stats:%s/stats.json", g_dir);
  CHECK(run_child("child_report_exit", plant, conf, &r) == 0);
  ok = check_report_run(&r, 0, NULL);
  free_run(&r);
  CHECK(ok);
  CHECK(complete_dump(path, 0));
  content = slurp(victim, NULL);
  ok = strcmp(content, "precious") == 0;
  free(content);
  CHECK(ok);
  return 0;
}

/* ------------------------------------------------ item 7: process life */

/* child of fork_exec: a fresh process image with its own cachalloc. */
static int child_exec(void) {
  CUdeviceptr p = 0, q = 0;
  CHECK(setup() == 0);
  CHECK_CU(cuMemAlloc_v2(&p, 5000));
  CHECK_CU(cuMemFree_v2(p));
  CHECK_CU(cuMemAlloc_v2(&q, 5000));
  CHECK(stats().mem_alloc == (shim() ? 1u : 2u)); /* served by its own cache under the shim */
  CHECK_CU(cuMemFree_v2(q));
  exit(0); /* exit(): its own reports */
}

/* fork() then exec of a CUDA program from a process using cachalloc: the
 * child gets its own cachalloc (its own cache and its own stats dump); the
 * parent goes on unaffected. */
static int fork_exec(void) {
  char conf[256], path[256];
  CHECK(make_dir() == 0);
  snprintf(conf, sizeof conf, "stats:%s/stats-%%p.json", g_dir);
  setenv("CACHALLOC_CONF", conf, 1);
  CHECK(setup() == 0);
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 5000));
  CHECK_CU(cuMemFree_v2(p));
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", g_self, "child_exec", (char*)NULL);
    _exit(121);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  snprintf(path, sizeof path, "%s/stats-%d.json", g_dir, (int)pid);
  if (shim()) CHECK(complete_dump(path, pid)); /* the child's own dump */
  unsigned long allocs = stats().mem_alloc;
  CHECK_CU(cuMemAlloc_v2(&q, 5000)); /* the parent's cache still serves */
  if (shim()) CHECK(q == p && stats().mem_alloc == allocs);
  CHECK_CU(cuMemFree_v2(q));
  return 0;
}

/* fork() without exec: the child passes every call to the driver (CUDA
 * state does not survive fork; a real driver answers with its error), and
 * never writes the parent's reports; the parent is unaffected. */
static int fork_no_exec(void) {
  char conf[256], path[256];
  CHECK(make_dir() == 0);
  snprintf(conf, sizeof conf, "stats:%s/stats-%%p.json", g_dir);
  setenv("CACHALLOC_CONF", conf, 1);
  CHECK(setup() == 0);
  CUdeviceptr p = 0, q = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 5000));
  CHECK_CU(cuMemFree_v2(p));
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    CUdeviceptr c = 0;
    unsigned long before = stats().mem_alloc;
    if (cuMemAlloc_v2(&c, 5000) != CUDA_SUCCESS || cuMemFree_v2(c) != CUDA_SUCCESS) _exit(2);
    if (stats().mem_alloc != before + 1) _exit(3); /* it reached the driver */
    exit(0);                                        /* exit(): atexit handlers run, and must write nothing */
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  snprintf(path, sizeof path, "%s/stats-%d.json", g_dir, (int)pid);
  CHECK(!exists(path));
  unsigned long allocs = stats().mem_alloc;
  CHECK_CU(cuMemAlloc_v2(&q, 5000));
  if (shim()) CHECK(q == p && stats().mem_alloc == allocs);
  CHECK_CU(cuMemFree_v2(q));
  return 0;
}

/* child of exit_other_thread: threads allocate and free in loops (errors
 * ignored: once exit() has begun allocations fail) while another thread
 * calls exit(0) after argv milliseconds. */
static volatile int g_spin = 1;

static void* churn_forever(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  CUdeviceptr live[8] = {0};
  cuCtxSetCurrent(g_primary);
  while (g_spin) {
    int i = (int)(rand_r(&seed) % 8);
    if (live[i] != 0) {
      cuMemFree_v2(live[i]);
      live[i] = 0;
    } else if (cuMemAlloc_v2(&live[i], 512 + rand_r(&seed) % (3 * MiB)) != CUDA_SUCCESS) {
      live[i] = 0;
    }
  }
  return NULL;
}

static void* exit_later(void* arg) {
  struct timespec ts = {0, (long)(uintptr_t)arg * 1000000L};
  nanosleep(&ts, NULL);
  exit(0);
}

static int child_exit_thread(const char* ms) {
  CHECK(setup() == 0);
  CUdeviceptr first = 0; /* cachalloc starts (and will report) at the first allocation */
  CHECK_CU(cuMemAlloc_v2(&first, 4096));
  pthread_t t;
  for (uintptr_t i = 1; i <= 2; ++i) CHECK(pthread_create(&t, NULL, churn_forever, (void*)i) == 0);
  CHECK(pthread_create(&t, NULL, exit_later, (void*)(uintptr_t)atoi(ms)) == 0);
  churn_forever((void*)(uintptr_t)7);
  return 1; /* not reached */
}

/* exit() from another thread while allocations are in flight: no crash,
 * exit status 0, the reports written exactly once. */
static int exit_other_thread(void) {
  char conf[512], path[256], ms[16];
  CHECK(make_dir() == 0);
  for (int round = 0; round < 24; ++round) {
    struct child_run r;
    snprintf(ms, sizeof ms, "%d", round % 6 * 3);
    int table = round % 2 == 0;
    snprintf(path, sizeof path, "%s/stats-%d.json", g_dir, round);
    snprintf(conf, sizeof conf, "stats:%s", table ? "stderr" : path);
    CHECK(run_child("child_exit_thread", ms, conf, &r) == 0);
    int ok = exited_with(&r, 0) &&
             (table ? count_of(r.err, "cachalloc CUDA memory summary") == 1 : complete_dump(path, 0)) &&
             count_of(r.err, "warning") == 0;
    if (!ok) {
      fprintf(stderr, "[hostile exit_other_thread] round %d (%s):\n", round, conf);
      SHOW_RUN(r);
    }
    free_run(&r);
    CHECK(ok);
  }
  return 0;
}

/* child of static_destructors: frees (and an allocation) from an atexit
 * handler that runs after cachalloc's exit handling, from the program's
 * destructor and from a library's destructor: each free succeeds without a
 * driver call, the allocation fails cleanly. */
static CUdeviceptr g_late[3];

static void say(const char* text) {
  ssize_t ignored = write(2, text, strlen(text));
  (void)ignored;
}

/* Under the shim: the free succeeds, the allocation fails with
 * CUDA_ERROR_DEINITIALIZED, and neither reaches the driver.  Bare: the
 * driver's own answers (the fake is still alive). */
static int late_calls_ok(CUdeviceptr p) {
  struct fake_cuda_stats_t before = stats();
  CUdeviceptr q = 0;
  int ok = cuMemFree_v2(p) == CUDA_SUCCESS;
  CUresult r = cuMemAlloc_v2(&q, 1000);
  if (shim()) {
    struct fake_cuda_stats_t after = stats();
    ok = ok && r == CUDA_ERROR_DEINITIALIZED && after.mem_free == before.mem_free &&
         after.mem_alloc == before.mem_alloc && after.mem_alloc_failed == before.mem_alloc_failed;
  }
  return ok;
}

static void late_atexit(void) {
  say(late_calls_ok(g_late[0]) ? "atexit: ok\n" : "atexit: FAILED\n");
}

__attribute__((destructor)) static void program_destructor(void) {
  if (g_late[1] == 0) return;
  say(late_calls_ok(g_late[1]) ? "destructor: ok\n" : "destructor: FAILED\n");
}

static void early_atexit(void) { say(cuMemFree_v2(g_late[2]) == CUDA_SUCCESS ? "early atexit: ok\n" : "early atexit: FAILED\n"); }

static int child_static_dtor(const char* library) {
  atexit(late_atexit); /* before the first CUDA call: runs after cachalloc's handler */
  CHECK(setup() == 0);
  for (int i = 0; i < 3; ++i) CHECK_CU(cuMemAlloc_v2(&g_late[i], 4096));
  atexit(early_atexit); /* after: runs before cachalloc's handler, while it still serves */
  void* h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL);
  void (*keep)(CUdeviceptr) = (void (*)(CUdeviceptr))dlsym(h, "hostile_dl_free_at_exit");
  CHECK(keep != NULL);
  CUdeviceptr lib_ptr = 0;
  CHECK_CU(cuMemAlloc_v2(&lib_ptr, 8192));
  keep(lib_ptr);
  exit(0);
}

static int static_destructors(const char* library) {
  CHECK(make_dir() == 0);
  struct child_run r;
  CHECK(run_child("child_static_dtor", library, "stats:stderr", &r) == 0);
  int ok = exited_with(&r, 0) && count_of(r.err, ": ok\n") == 4 && count_of(r.err, "FAILED") == 0 &&
           count_of(r.err, "cachalloc CUDA memory summary") == (shim() ? 1 : 0);
  if (!ok) SHOW_RUN(r);
  free_run(&r);
  CHECK(ok);
  return 0;
}

/* dlclose of a library that allocated device memory through the shim and
 * freed some of it: its remaining pointers are freed later by the program,
 * new allocations reuse the cache, and the library can be loaded again. */
static int dlclose_library(const char* library) {
  enum { N = 8 };
  for (int round = 0; round < 2; ++round) {
    void* h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    int (*lib_alloc)(CUdeviceptr*, int, CUdeviceptr*) =
        (int (*)(CUdeviceptr*, int, CUdeviceptr*))dlsym(h, "hostile_dl_alloc");
    CHECK(lib_alloc != NULL);
    CUdeviceptr p[N], async_p = 0;
    CHECK(lib_alloc(p, N, &async_p) == 0);
    CHECK(dlclose(h) == 0);
    CHECK(dlopen(library, RTLD_NOW | RTLD_NOLOAD) == NULL); /* really unloaded */
    struct fake_cuda_stats_t before = stats();
    for (int i = 1; i < N; i += 2) {
      CHECK(holds(p[i], 64 * KiB + (size_t)i * 512, (unsigned char)(0x40 + i)));
      CHECK_CU(cuMemFree_v2(p[i]));
    }
    CHECK(holds(async_p, 4096, 0x7a));
    CHECK_CU(cuMemFreeAsync(async_p, NULL));
    if (shim()) CHECK(stats().mem_free == before.mem_free); /* all back in the cache */
    CUdeviceptr q = 0;
    for (int i = 0; i < N; ++i) {
      CHECK_CU(cuMemAlloc_v2(&q, 64 * KiB + (size_t)i * 512));
      CHECK_CU(cuMemsetD8_v2(q, 0x66, 64 * KiB));
      CHECK_CU(cuMemFree_v2(q));
    }
    if (shim()) CHECK(stats().mem_alloc == before.mem_alloc); /* served from the library's freed blocks */
  }
  return 0;
}

/* --------------------------------------- signals during a dump (harness) */

/* child for signals_during_dump.py: builds a large state (many live blocks,
 * a long trace), says "ready", then "exit" prints "exiting" and calls
 * exit(0) (the harness signals it while it writes its reports), "wait"
 * waits quietly for signals. */
static int child_dump_target(const char* how) {
  CHECK(setup() == 0);
  enum { N = 20000 };
  static CUdeviceptr p[N];
  unsigned seed = 1;
  for (int i = 0; i < N; ++i) CHECK_CU(cuMemAlloc_v2(&p[i], 512 + rand_r(&seed) % (64 * KiB)));
  for (int i = 0; i < N; i += 3) CHECK_CU(cuMemFree_v2(p[i]));
  printf("ready\n");
  fflush(stdout);
  if (strcmp(how, "exit") == 0) {
    printf("exiting\n");
    fflush(stdout);
    exit(0);
  }
  for (int i = 0; i < 600; ++i) sleep(1); /* the harness ends it */
  return 2;
}

/* ------------------------------------------------------------------ main */

struct test_case {
  const char* name;
  int (*run)(void);
  int needs_setup;
};

static const struct test_case cases[] = {
    {"double_free", double_free, 1},
    {"interior_pointer", interior_pointer, 1},
    {"foreign_pointer", foreign_pointer, 1},
    {"other_context", other_context, 1},
    {"destroyed_context", destroyed_context, 1},
    {"free_during_capture", free_during_capture, 1},
    {"huge_sizes", huge_sizes, 1},
    {"zero_size", zero_size, 1},
    {"bad_conf", bad_conf, 0},
    {"huge_conf", huge_conf, 0},
    {"report_paths", report_paths, 0},
    {"fork_exec", fork_exec, 0},
    {"fork_no_exec", fork_no_exec, 0},
    {"exit_other_thread", exit_other_thread, 0},
};

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  g_self = argv[0];
  g_case = argv[1];
  const char* arg = argc > 2 ? argv[2] : NULL;
  /* Children run by the supervising cases. */
  if (strcmp(g_case, "child_conf") == 0) return child_conf(arg ? arg : "");
  if (strcmp(g_case, "child_huge_conf") == 0) return child_huge_conf(arg ? arg : "");
  if (strcmp(g_case, "child_report_exit") == 0) return child_report_exit(arg);
  if (strcmp(g_case, "child_exec") == 0) return child_exec();
  if (strcmp(g_case, "child_exit_thread") == 0) return child_exit_thread(arg ? arg : "0");
  if (strcmp(g_case, "child_static_dtor") == 0) return child_static_dtor(arg);
  if (strcmp(g_case, "child_dump_target") == 0) return child_dump_target(arg ? arg : "exit");
  /* Cases that take the library's path. */
  if (strcmp(g_case, "static_destructors") == 0) return arg ? static_destructors(arg) : 2;
  if (strcmp(g_case, "dlclose_library") == 0) return arg && setup() == 0 ? dlclose_library(arg) : 2;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    if (strcmp(cases[i].name, g_case) != 0) continue;
    if (cases[i].needs_setup && setup() != 0) return 1;
    return cases[i].run();
  }
  fprintf(stderr, "unknown case %s\n", g_case);
  return 2;
}
