/* bench_shim.c — host-side cost of the shim's paths, on the fake driver.
 *
 * Not a test: run by hand (docs/INTERPOSER.md quotes its output).  Reaches
 * the driver through dlsym on the libcuda handle, so the same binary runs
 * with and without LD_PRELOAD=libcachalloc.so.  Prints ns per
 * cuMemAlloc_v2+cuMemFree_v2 pair for a few sizes with `streams` extra
 * streams alive (0 = legacy stream only; >0 makes free_sync:auto fence), and
 * ns per dlsym lookup of a non-CUDA name and of a driver name.
 * Usage: bench_shim [streams]
 *        bench_shim threads [max_threads] [rounds]
 * The threads mode prints the aggregate 512 B pairs per second of 1, 2, 4,
 * ... max_threads threads (default 2), each with the primary context
 * current, all on the legacy stream: the median of `rounds` (default 7)
 * rounds, the thread counts interleaved within each round.  It also prints
 * pairs per CPU-second (each thread's CLOCK_THREAD_CPUTIME_ID, summed): on
 * a machine whose cores are shared with other work the wall-clock figure
 * cannot scale, but a shared lock or cache line still shows as CPU time
 * per pair rising with threads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>

#include <cuda.h>
#include <cudaTypedefs.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Median over `rounds` rounds of `iters` pairs each. */
static double pair_ns(PFN_cuMemAlloc_v3020 alloc, PFN_cuMemFree_v3020 release, size_t size) {
  enum { rounds = 9, iters = 2000 };
  double r[rounds];
  for (int k = 0; k < rounds; ++k) {
    double t0 = now_ns();
    for (int i = 0; i < iters; ++i) {
      CUdeviceptr p;
      if (alloc(&p, size) != CUDA_SUCCESS || release(p) != CUDA_SUCCESS) {
        fprintf(stderr, "allocation failed\n");
        exit(1);
      }
    }
    r[k] = (now_ns() - t0) / iters;
  }
  qsort(r, rounds, sizeof r[0], cmp);
  return r[rounds / 2];
}

static double dlsym_ns(void* handle, const char* name) {
  enum { iters = 200000 };
  double t0 = now_ns();
  for (int i = 0; i < iters; ++i)
    if (dlsym(handle, name) == NULL) return -1;
  return (now_ns() - t0) / iters;
}

/* ---- threads mode ---- */
static PFN_cuMemAlloc_v3020 g_alloc;
static PFN_cuMemFree_v3020 g_release;
static PFN_cuCtxSetCurrent_v4000 g_set_current;
static CUcontext g_ctx;
static pthread_barrier_t g_start;
enum { kThreadPairs = 200000 };

static double g_cpu[64];
/* Each worker's own wall-clock start and end: the main thread may wait for a
 * core after the barrier (two workers on two cores), so its own clock read
 * would start late and inflate the rate. */
static double g_begin[64], g_end[64];

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void* pair_thread(void* arg) {
  double* cpu = arg;
  const size_t me = (size_t)(cpu - g_cpu);
  if (g_set_current(g_ctx) != CUDA_SUCCESS) exit(1);
  pthread_barrier_wait(&g_start);
  g_begin[me] = now_ns();
  double c0 = cpu_ns();
  for (int i = 0; i < kThreadPairs; ++i) {
    CUdeviceptr p;
    if (g_alloc(&p, 512) != CUDA_SUCCESS || g_release(p) != CUDA_SUCCESS) {
      fprintf(stderr, "allocation failed\n");
      exit(1);
    }
  }
  *cpu = cpu_ns() - c0;
  g_end[me] = now_ns();
  return NULL;
}

/* Aggregate pairs per second of `n` threads; *per_cpu: pairs per CPU-second. */
static double threads_rate(int n, double* per_cpu) {
  pthread_t t[64];
  pthread_barrier_init(&g_start, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; ++i) pthread_create(&t[i], NULL, pair_thread, &g_cpu[i]);
  pthread_barrier_wait(&g_start);
  for (int i = 0; i < n; ++i) pthread_join(t[i], NULL);
  double first = g_begin[0], last = g_end[0];
  for (int i = 1; i < n; ++i) {
    if (g_begin[i] < first) first = g_begin[i];
    if (g_end[i] > last) last = g_end[i];
  }
  double secs = (last - first) / 1e9;
  pthread_barrier_destroy(&g_start);
  double cpu = 0;
  for (int i = 0; i < n; ++i) cpu += g_cpu[i];
  *per_cpu = (double)n * kThreadPairs / (cpu / 1e9);
  return (double)n * kThreadPairs / secs;
}

static int threads_mode(int max_threads, int rounds) {
  enum { kMaxCounts = 7, kMaxRounds = 31 };
  double r[kMaxCounts][kMaxRounds], pc[kMaxCounts][kMaxRounds];
  int counts[kMaxCounts], nc = 0;
  for (int n = 1; n <= max_threads && n <= 64 && nc < kMaxCounts; n *= 2) counts[nc++] = n;
  if (rounds > kMaxRounds) rounds = kMaxRounds;
  for (int k = 0; k < rounds; ++k)
    for (int c = 0; c < nc; ++c) r[c][k] = threads_rate(counts[c], &pc[c][k]);
  double base = 0, base_cpu = 0;
  for (int c = 0; c < nc; ++c) {
    qsort(r[c], (size_t)rounds, sizeof r[c][0], cmp);
    qsort(pc[c], (size_t)rounds, sizeof pc[c][0], cmp);
    double med = r[c][rounds / 2], med_cpu = pc[c][rounds / 2];
    if (c == 0) base = med, base_cpu = med_cpu;
    printf("threads=%d  %.3f M pairs/s (512 B, median of %d)  %.2fx one thread;  %.3f M pairs per CPU-second  %.2fx\n",
           counts[c], med / 1e6, rounds, med / base, med_cpu / 1e6, med_cpu / base_cpu);
  }
  return 0;
}

int main(int argc, char** argv) {
  int threads = argc > 1 && argv[1][0] == 't';
  int streams = argc > 1 && !threads ? atoi(argv[1]) : 0;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return 1;
  PFN_cuInit_v2000 init = (PFN_cuInit_v2000)dlsym(h, "cuInit");
  PFN_cuDeviceGet_v2000 device_get = (PFN_cuDeviceGet_v2000)dlsym(h, "cuDeviceGet");
  PFN_cuDevicePrimaryCtxRetain_v7000 retain = (PFN_cuDevicePrimaryCtxRetain_v7000)dlsym(h, "cuDevicePrimaryCtxRetain");
  PFN_cuCtxSetCurrent_v4000 set_current = (PFN_cuCtxSetCurrent_v4000)dlsym(h, "cuCtxSetCurrent");
  PFN_cuStreamCreate_v2000 stream_create = (PFN_cuStreamCreate_v2000)dlsym(h, "cuStreamCreate");
  PFN_cuMemAlloc_v3020 alloc = (PFN_cuMemAlloc_v3020)dlsym(h, "cuMemAlloc_v2");
  PFN_cuMemFree_v3020 release = (PFN_cuMemFree_v3020)dlsym(h, "cuMemFree_v2");
  CUdevice dev;
  CUcontext ctx;
  if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx)) return 1;
  if (threads) {
    g_alloc = alloc;
    g_release = release;
    g_set_current = set_current;
    g_ctx = ctx;
    return threads_mode(argc > 2 ? atoi(argv[2]) : 2, argc > 3 ? atoi(argv[3]) : 7);
  }
  for (int i = 0; i < streams; ++i) {
    CUstream s;
    if (stream_create(&s, 0)) return 1;
  }
  printf("streams=%d  512B %.0f ns  1MiB %.0f ns  64MiB %.0f ns per alloc+free pair\n", streams,
         pair_ns(alloc, release, 512), pair_ns(alloc, release, 1 << 20), pair_ns(alloc, release, 64u << 20));
  printf("dlsym: non-CUDA name %.0f ns, cuMemAlloc_v2 on libcuda %.0f ns\n", dlsym_ns(RTLD_DEFAULT, "printf"),
         dlsym_ns(h, "cuMemAlloc_v2"));
  return 0;
}
