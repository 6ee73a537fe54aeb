// watch_cost.cu — what watching every stream-naming entry point costs
// (issue 34, item 1; docs/BENCHMARKS.md "The cost of watching streams").
//
// Static cudart fetches every driver function through cuGetProcAddress, so
// under cachalloc each call below that names a stream goes through a
// generated wrapper (shim/stream_watch.h).  Modes, each timed over N
// iterations after a warm-up, one line "mode ns_per_iter peak_mib":
//   launch   an empty kernel on stream 0
//   event    cudaEventRecord + cudaStreamWaitEvent + cudaStreamQuery on stream 0
//   single   cudaMalloc(1 MiB) + a kernel writing it + cudaFree, stream 0 only
//   threads  4 threads, each: cudaMalloc + a kernel on cudaStreamPerThread +
//            cudaFree (several per-thread streams: frees are fenced)
// peak_mib: the most device memory in use above the start, sampled with
// cudaMemGetInfo every 64 iterations (the same way for every contender).
// Usage: watch_cost MODE [N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "../examples/example_checks.cuh"

namespace {

__global__ void empty() {}
__global__ void touch(int* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 1;
}

size_t g_base_free = 0;
size_t used_now() {
  size_t f = 0, t = 0;
  MUST(cudaMemGetInfo(&f, &t));
  return g_base_free > f ? g_base_free - f : 0;
}

constexpr size_t kWords = (1 << 20) / sizeof(int);

size_t alloc_loop(int n, cudaStream_t s) {
  size_t peak = 0;
  for (int i = 0; i < n; ++i) {
    int* p = nullptr;
    MUST(cudaMalloc(&p, kWords * sizeof(int)));
    touch<<<8, 128, 0, s>>>(p, kWords);
    MUST(cudaFree(p));
    if (i % 64 == 0) peak = std::max(peak, used_now());
  }
  return peak;
}

double run(const char* mode, int n, size_t* peak) {
  cudaEvent_t e;
  MUST(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const auto t0 = std::chrono::steady_clock::now();
  if (std::strcmp(mode, "launch") == 0) {
    for (int i = 0; i < n; ++i) empty<<<1, 1>>>();
  } else if (std::strcmp(mode, "event") == 0) {
    for (int i = 0; i < n; ++i) {
      MUST(cudaEventRecord(e, 0));
      MUST(cudaStreamWaitEvent(0, e, 0));
      cudaStreamQuery(0);  // cudaErrorNotReady is an answer, not an error
    }
  } else if (std::strcmp(mode, "single") == 0) {
    *peak = alloc_loop(n, 0);
  } else if (std::strcmp(mode, "threads") == 0) {
    std::vector<std::thread> ts;
    std::vector<size_t> peaks(4, 0);
    for (int t = 0; t < 4; ++t) ts.emplace_back([&, t] { peaks[t] = alloc_loop(n / 4, cudaStreamPerThread); });
    for (auto& t : ts) t.join();
    for (size_t p : peaks) *peak = std::max(*peak, p);
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode);
    std::exit(2);
  }
  MUST(cudaDeviceSynchronize());
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  MUST(cudaEventDestroy(e));
  return ns / n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s launch|event|single|threads [N]\n", argv[0]);
    return 2;
  }
  const int n = argc > 2 ? std::atoi(argv[2]) : 20000;
  MUST(cudaFree(nullptr));
  size_t t = 0;
  MUST(cudaMemGetInfo(&g_base_free, &t));
  size_t peak = 0;
  run(argv[1], n / 10 + 1, &peak);  // warm-up: caches filled, lookups done
  peak = 0;
  const double ns = run(argv[1], n, &peak);
  peak = std::max(peak, used_now());
  std::printf("%s %.1f %.1f\n", argv[1], ns, peak / 1048576.0);
  return 0;
}
