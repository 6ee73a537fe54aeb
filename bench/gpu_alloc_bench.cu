// gpu_alloc_bench.cu — host-side latency of device allocation through the
// CUDA runtime, the figures docs/notes compare (see
// /work/shared/notes/interposition-facts.md, "Latency baselines").
//
// Measures ns per malloc+free pair for 512 B, 1 MiB and 64 MiB, and a churn
// of 1000 live blocks of random sizes (log-uniform over 512 B .. 32 MiB, so
// small and large blocks are equally represented): one op is one call, a
// free or a malloc, each replacement being one of each.  Two paths:
// cudaMalloc+cudaFree (measured first, while the program has no stream but
// the default one) and cudaMallocAsync+cudaFreeAsync (default pool, release
// threshold = max, on one non-blocking stream created after), then
// cudaMalloc+cudaFree again with that stream alive ("/stream-live").  Each figure is the
// median of several runs.  Run it with and without libcachalloc.so preloaded,
// built with static and with shared cudart.
//
//   gpu_alloc_bench [variant-label]
// prints `BENCH variant=... shim=yes|no path=... case=... ns=... runs=...`
// lines (machine-readable) and then a table.  Exit 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::size_t KiB = 1024, MiB = KiB * KiB;
constexpr int kRuns = 7;
constexpr int kLive = 1000;

using Clock = std::chrono::steady_clock;

struct Path {
  const char* name;
  int pair_iters;    // malloc+free pairs per run
  int replacements;  // churn replacements per run
  bool async;
};

cudaStream_t g_stream = nullptr;

void die(cudaError_t e, const char* what) {
  std::printf("gpu_alloc_bench: %s failed: %s\n", what, cudaGetErrorName(e));
  std::exit(1);
}

void* alloc(const Path& p, std::size_t bytes) {
  void* ptr = nullptr;
  cudaError_t e = p.async ? cudaMallocAsync(&ptr, bytes, g_stream) : cudaMalloc(&ptr, bytes);
  if (e != cudaSuccess) die(e, p.async ? "cudaMallocAsync" : "cudaMalloc");
  return ptr;
}

void release(const Path& p, void* ptr) {
  cudaError_t e = p.async ? cudaFreeAsync(ptr, g_stream) : cudaFree(ptr);
  if (e != cudaSuccess) die(e, p.async ? "cudaFreeAsync" : "cudaFree");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ns_per_pair(const Path& p, std::size_t bytes) {
  for (int i = 0; i < 20; ++i) release(p, alloc(p, bytes));  // warm up: first use, cache fill
  std::vector<double> runs;
  for (int r = 0; r < kRuns; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < p.pair_iters; ++i) release(p, alloc(p, bytes));
    runs.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / p.pair_iters);
  }
  return median(runs);
}

std::size_t random_size(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> log2size(9.0, 25.0);  // 512 B .. 32 MiB
  return static_cast<std::size_t>(std::exp2(log2size(rng)));
}

double ns_per_churn_op(const Path& p) {
  std::vector<double> runs;
  for (int r = 0; r < kRuns; ++r) {
    std::mt19937_64 rng(1234 + r);  // the same sizes for every variant
    std::vector<void*> live(kLive);
    for (auto& ptr : live) ptr = alloc(p, random_size(rng));
    std::uniform_int_distribution<int> slot(0, kLive - 1);
    auto t0 = Clock::now();
    for (int i = 0; i < p.replacements; ++i) {
      void*& ptr = live[slot(rng)];
      release(p, ptr);
      ptr = alloc(p, random_size(rng));
    }
    runs.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                   (2.0 * p.replacements));
    for (void* ptr : live) release(p, ptr);
    cudaStreamSynchronize(g_stream);
  }
  return median(runs);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_alloc_bench: SKIP (no usable GPU)\n");
    return 77;
  }
  const std::string variant = argc > 1 ? argv[1] : "unnamed";
  const char* preload = std::getenv("LD_PRELOAD");
  const char* shim = preload && std::strstr(preload, "cachalloc") ? "yes" : "no";

  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
    std::uint64_t keep_all = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
  }

  // The third row repeats the first once a non-blocking stream exists: what
  // a plain cudaFree costs when the interposer must fence other streams.
  const Path paths[] = {{"cudaMalloc+cudaFree", 500, 2000, false},
                        {"cudaMallocAsync+cudaFreeAsync", 5000, 5000, true},
                        {"cudaMalloc+cudaFree/stream-live", 500, 2000, false}};
  constexpr int kPaths = sizeof paths / sizeof paths[0];
  const std::pair<const char*, std::size_t> sizes[] = {{"512B", 512}, {"1MiB", MiB}, {"64MiB", 64 * MiB}};
  double table[kPaths][4];
  for (int pi = 0; pi < kPaths; ++pi) {
    const Path& p = paths[pi];
    // The stream is created only now: the cudaMalloc path runs first in a
    // program with no stream but the default one, the case an interposer
    // must make cheapest (its free_sync:auto then needs no fence).
    if (p.async && !g_stream)
      if (cudaError_t e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking)) die(e, "cudaStreamCreate");
    for (int si = 0; si < 3; ++si) {
      table[pi][si] = ns_per_pair(p, sizes[si].second);
      std::printf("BENCH variant=%s shim=%s path=%s case=%s ns=%.0f runs=%d\n", variant.c_str(), shim,
                  p.name, sizes[si].first, table[pi][si], kRuns);
    }
    table[pi][3] = ns_per_churn_op(p);
    std::printf("BENCH variant=%s shim=%s path=%s case=churn ns=%.0f runs=%d\n", variant.c_str(), shim,
                p.name, table[pi][3], kRuns);
    std::fflush(stdout);
  }
  std::printf("\n%s (shim: %s), host ns per malloc+free pair, median of %d runs\n", variant.c_str(), shim, kRuns);
  std::printf("%-31s %10s %10s %10s %14s\n", "path", "512 B", "1 MiB", "64 MiB", "churn ns/op");
  for (int pi = 0; pi < kPaths; ++pi)
    std::printf("%-31s %10.0f %10.0f %10.0f %14.0f\n", paths[pi].name, table[pi][0], table[pi][1],
                table[pi][2], table[pi][3]);
  cudaStreamDestroy(g_stream);
  return 0;
}
