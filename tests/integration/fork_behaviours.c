/* fork_behaviours.c — a forked child never touches a lock or a cache it
 * inherited (issue 34, item 3).
 *
 * fork() copies every lock in the state another thread left it: one held
 * by a thread that does not exist in the child stays held there forever.
 * A thread with a per-thread front cache (core/thread_cache.h) that forked
 * and then left the child through pthread_exit or by returning ran the
 * cache's exit hook there, which took the registry's and the allocator's
 * locks: 14 of 20 children hung.  Here every fork happens while another
 * thread surely holds the allocator's lock: it is inside the driver's
 * cuMemAlloc_v2, growing the pool (fake_cuda_on_mem_alloc stops it there
 * until the fork is done).  Meanwhile other threads hold front caches, one
 * churns pairs through its cache and one keeps creating threads that make
 * a cache and exit (the registry's lock, taken on both paths).  Each child
 * leaves one way — pthread_exit or return from the forking thread, exit(),
 * _exit(), pthread_exit or exit() from the main thread, which forked with
 * a cache of its own — and must end within the deadline; a hung child is
 * killed and fails the test.
 *
 * Skipped when built with ASan or TSan: their runtimes' own allocator
 * locks are not fork-safe (GCC 12: a child hung in AsanThread::Destroy
 * waiting on the allocator's mutex that a parent thread held at fork), and
 * LeakSanitizer's exit check in a child reports the memory of threads that
 * do not exist there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "route_common.h"

#define MiB ((size_t)1 << 20)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FORK_UNDER_SANITIZER 1
#else
#define FORK_UNDER_SANITIZER 0
#endif

enum { kForksPerWay = 6, kHolders = 3, kMaxChildren = 64, kMaxKept = 64, kDeadlineMs = 10000 };

/* How a child leaves (the first four from the forking thread, the last two
 * from the main thread). */
enum way { kThreadExit, kThreadReturn, kExit, kUnderscoreExit, kMainThreadExit, kMainExit, kWays };
static const char* const kWayNames[kWays] = {"pthread_exit", "return", "exit", "_exit", "main pthread_exit",
                                             "main exit"};

/* The lock holder: `want` asks it to grow the pool; inside the driver
 * (its allocator's lock held) it sets `held` and waits until `held` is
 * cleared again after the fork. */
static struct {
  pthread_mutex_t m;
  pthread_cond_t c;
  pthread_t locker;
  int want, held, fired, stop, failed;
} g_sync = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};

static volatile int g_stop_background;
static pid_t g_children[kMaxChildren];
static enum way g_child_way[kMaxChildren];
static int g_nchildren;

/* fake_cuda_on_mem_alloc: only the locker's own call waits. */
static void hold_in_driver(void* arg) {
  (void)arg;
  if (!pthread_equal(pthread_self(), g_sync.locker)) return;
  pthread_mutex_lock(&g_sync.m);
  g_sync.held = g_sync.fired = 1;
  pthread_cond_broadcast(&g_sync.c);
  while (g_sync.held) pthread_cond_wait(&g_sync.c, &g_sync.m);
  pthread_mutex_unlock(&g_sync.m);
}

/* Each round new 12 MiB blocks (kept: a freed one would serve the next
 * round without the driver; over 10 MiB: a segment of its own) until one
 * reached cuMemAlloc_v2. */
static int g_nkept;
static void* locker(void* arg) {
  CUdeviceptr* kept = arg;
  if (A->ctx_set_current(g_ctx) != CUDA_SUCCESS) g_sync.failed = 1;
  pthread_mutex_lock(&g_sync.m);
  for (;;) {
    while (!g_sync.want && !g_sync.stop) pthread_cond_wait(&g_sync.c, &g_sync.m);
    if (g_sync.stop) break;
    g_sync.want = g_sync.fired = 0;
    while (!g_sync.fired && !g_sync.failed) {
      pthread_mutex_unlock(&g_sync.m);
      if (g_nkept == kMaxKept || A->mem_alloc(&kept[g_nkept++], 12 * MiB) != CUDA_SUCCESS) g_sync.failed = 1;
      pthread_mutex_lock(&g_sync.m);
    }
    if (g_sync.failed) { /* no hold: wake the forker, the test fails */
      g_sync.held = 1;
      pthread_cond_broadcast(&g_sync.c);
    }
  }
  pthread_mutex_unlock(&g_sync.m);
  return NULL;
}

/* Small pairs through the calling thread's front cache (made by the first
 * free). */
static int use_cache(int pairs) {
  CUdeviceptr p[8];
  for (int r = 0; r < pairs; ++r) {
    for (int i = 0; i < 8; ++i)
      if (A->mem_alloc(&p[i], 512 * (size_t)(i + 1)) != CUDA_SUCCESS) return 0;
    for (int i = 0; i < 8; ++i)
      if (A->mem_free(p[i]) != CUDA_SUCCESS) return 0;
  }
  return 1;
}

/* A thread with a front cache, idle (or churning) until the end. */
static void* holder(void* arg) {
  const int churn = arg != NULL;
  int ok = A->ctx_set_current(g_ctx) == CUDA_SUCCESS && use_cache(1);
  while (ok && !g_stop_background) ok = churn ? use_cache(1) : (usleep(1000), 1);
  return ok ? NULL : (void*)1;
}

static void* short_lived(void* arg) {
  (void)arg;
  return A->ctx_set_current(g_ctx) == CUDA_SUCCESS && use_cache(1) ? NULL : (void*)1;
}

/* Threads that make a cache and exit, one after another: the registry's
 * lock is taken at each creation and exit. */
static void* spawner(void* arg) {
  (void)arg;
  while (!g_stop_background) {
    pthread_t t;
    void* r = NULL;
    if (pthread_create(&t, NULL, short_lived, NULL) != 0 || pthread_join(t, &r) != 0 || r != NULL) return (void*)1;
  }
  return NULL;
}

/* fork() while the locker holds its allocator's lock inside the driver;
 * the parent lets it go afterwards.  The child touches nothing here. */
static pid_t fork_while_held(enum way way) {
  pthread_mutex_lock(&g_sync.m);
  g_sync.want = 1;
  pthread_cond_broadcast(&g_sync.c);
  while (!g_sync.held) pthread_cond_wait(&g_sync.c, &g_sync.m);
  pthread_mutex_unlock(&g_sync.m);
  const pid_t pid = fork();
  if (pid == 0) return 0;
  pthread_mutex_lock(&g_sync.m);
  g_sync.held = 0;
  pthread_cond_broadcast(&g_sync.c);
  pthread_mutex_unlock(&g_sync.m);
  if (pid > 0 && g_nchildren < kMaxChildren) {
    g_child_way[g_nchildren] = way;
    g_children[g_nchildren++] = pid;
  }
  return pid;
}

/* The forking thread: a front cache of its own, then forks; its children
 * leave by the four thread-side ways. */
static void* forker(void* arg) {
  (void)arg;
  if (A->ctx_set_current(g_ctx) != CUDA_SUCCESS || !use_cache(2)) return (void*)1;
  for (int i = 0; i < kForksPerWay; ++i)
    for (int w = kThreadExit; w <= kUnderscoreExit; ++w) {
      const pid_t pid = fork_while_held((enum way)w);
      if (pid < 0) return (void*)1;
      if (pid > 0) continue;
      if (w == kThreadExit) pthread_exit(NULL);  /* the cache's exit hook runs here */
      if (w == kThreadReturn) return NULL;       /* ...and here */
      if (w == kExit) exit(0);
      _exit(0);
    }
  return NULL;
}

static long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Every child must have ended, with status 0, by the deadline; a hung one
 * is killed.  Returns how many failed, with a line per way on stderr. */
static int reap_children(void) {
  int hung[kWays] = {0}, bad[kWays] = {0}, failed = 0;
  const long deadline = now_ms() + kDeadlineMs;
  for (int i = 0; i < g_nchildren; ++i) {
    int status = 0;
    pid_t r = 0;
    while ((r = waitpid(g_children[i], &status, WNOHANG)) == 0 && now_ms() < deadline) usleep(2000);
    if (r == 0) {
      kill(g_children[i], SIGKILL);
      waitpid(g_children[i], &status, 0);
      ++hung[g_child_way[i]];
      ++failed;
    } else if (r != g_children[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++bad[g_child_way[i]];
      ++failed;
    }
  }
  for (int w = 0; w < kWays; ++w)
    if (hung[w] != 0 || bad[w] != 0)
      fprintf(stderr, "[%s] children leaving by %s: %d of %d hung, %d ended badly\n", g_route, kWayNames[w], hung[w],
              kForksPerWay, bad[w]);
  return failed;
}

static int tc_fork_exit(void) {
  static CUdeviceptr kept[kMaxKept];
  pthread_t lock_thread, holders[kHolders], spawn_thread, fork_thread;
  void* r = NULL;
  if (FORK_UNDER_SANITIZER) {
    fprintf(stderr, "[%s] skipped: the sanitizer runtime's locks are not fork-safe\n", g_route);
    return 77;
  }
  CHECK(use_cache(2)); /* the main thread's own cache */
  A->fake_on_mem_alloc(hold_in_driver, NULL);
  CHECK(pthread_create(&lock_thread, NULL, locker, kept) == 0);
  pthread_mutex_lock(&g_sync.m);
  g_sync.locker = lock_thread;
  pthread_mutex_unlock(&g_sync.m);
  for (int i = 0; i < kHolders; ++i) CHECK(pthread_create(&holders[i], NULL, holder, i == 0 ? (void*)1 : NULL) == 0);
  CHECK(pthread_create(&spawn_thread, NULL, spawner, NULL) == 0);
  CHECK(pthread_create(&fork_thread, NULL, forker, NULL) == 0);
  CHECK(pthread_join(fork_thread, &r) == 0 && r == NULL);
  for (int i = 0; i < kForksPerWay; ++i)
    for (int w = kMainThreadExit; w <= kMainExit; ++w) {
      const pid_t pid = fork_while_held((enum way)w);
      CHECK(pid >= 0);
      if (pid > 0) continue;
      if (w == kMainThreadExit) pthread_exit(NULL);
      exit(0);
    }
  g_stop_background = 1;
  pthread_mutex_lock(&g_sync.m);
  g_sync.stop = 1;
  pthread_cond_broadcast(&g_sync.c);
  pthread_mutex_unlock(&g_sync.m);
  CHECK(pthread_join(lock_thread, NULL) == 0);
  A->fake_on_mem_alloc(NULL, NULL);
  for (int i = 0; i < kHolders; ++i) CHECK(pthread_join(holders[i], &r) == 0 && r == NULL);
  CHECK(pthread_join(spawn_thread, &r) == 0 && r == NULL);
  CHECK(!g_sync.failed);
  CHECK(g_nchildren == kWays * kForksPerWay);
  CHECK(reap_children() == 0);
  /* The parent's caches and allocator are as they were. */
  CHECK(use_cache(2));
  for (int i = 0; i < g_nkept; ++i) CHECK_CU(A->mem_free(kept[i]));
  return 0;
}

/* The control and tag APIs in a child: each answers "not initialized" at
 * once, before any lock (a registry's or the tags' lock that a parent
 * thread held at the fork would never be released there), and leaves the
 * parent's state alone.  The child reports through its exit status. */
static int fork_control_api(void) {
  int (*set_tag)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "cachalloc_set_tag");
  int (*tag_paused)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "cachalloc_tag_paused");
  int (*pause)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "cachalloc_pause");
  int (*empty_cache)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachalloc_empty_cache");
  int (*set_fraction)(double, int) = (int (*)(double, int))dlsym(RTLD_DEFAULT, "cachalloc_set_memory_fraction");
  int (*validate)(char*, size_t) = (int (*)(char*, size_t))dlsym(RTLD_DEFAULT, "cachalloc_validate");
  int (*set_tag_with_backup)(const char*, int) = (int (*)(const char*, int))dlsym(RTLD_DEFAULT, "cachalloc_set_tag_with_backup");
  int (*set_retain)(const char*, int) = (int (*)(const char*, int))dlsym(RTLD_DEFAULT, "cachalloc_set_tag_retain_backup");
  int (*set_dir)(const char*, int) = (int (*)(const char*, int))dlsym(RTLD_DEFAULT, "cachalloc_set_pause_backup_dir");
  int (*empty_tag)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "cachalloc_empty_tag_cache");
  CHECK(set_tag && tag_paused && pause && empty_cache && set_fraction && validate);
  CHECK(set_tag_with_backup && set_retain && set_dir && empty_tag);
  CUdeviceptr p = 0;
  CHECK_CU(A->mem_alloc(&p, 1 << 20)); /* the parent is serving */
  CHECK(set_tag("weights") == 0);
  const pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    const int not_initialized = 3; /* CACHALLOC_ERROR_NOT_INITIALIZED */
    int bad = 0;
    bad |= (set_tag("kv") != not_initialized) << 0;
    bad |= (tag_paused("weights") != -not_initialized) << 1;
    bad |= (pause("weights") != not_initialized) << 2;
    bad |= (empty_cache(-1) != not_initialized) << 3;
    bad |= (set_fraction(0.5, -1) != not_initialized) << 4;
    bad |= (validate(NULL, 0) != not_initialized) << 5;
    bad |= (set_tag_with_backup("kv", 1) != not_initialized) << 6;
    bad |= (set_retain(NULL, 1) != not_initialized) << 7;
    bad |= (set_dir("/tmp", 1) != not_initialized) << 8;
    bad |= (empty_tag("weights") != not_initialized) << 9;
    _exit((bad & 0x7f) | (bad > 0x7f ? 0x80 : 0));  /* (an exit status has 8 bits: 0x80 = bits 7..9) */
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fprintf(stderr, "[%s] the child's control calls that did not answer 'not initialized': mask %#x\n", g_route,
            WIFEXITED(status) ? WEXITSTATUS(status) : 0xff);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(set_tag("") == 0);
  CHECK_CU(A->mem_free(p));
  return 0;
}

behaviour_fn fork_behaviour(const char* name) {
  if (strcmp(name, "tc_fork_exit") == 0) return tc_fork_exit;
  if (strcmp(name, "fork_control_api") == 0) return fork_control_api;
  return NULL;
}
