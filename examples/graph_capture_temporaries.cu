// graph_capture_temporaries.cu — a CUDA graph whose kernels use temporaries
// allocated and freed inside the capture, replayed many times while other
// threads allocate, fill, verify and free blocks of their own (issue 34,
// item 6).
//
// The graph (captured once, relaxed mode) computes out[i] = ((in[i] * 2) + 7) * 3
// through two temporaries:
//   t1  cudaMalloc + cudaFree inside the capture (under cachalloc; the
//       driver would free it at once, so bare it is cudaMallocAsync +
//       cudaFreeAsync on the capturing stream, graph memory nodes)
//   t2  cudaMallocAsync + cudaFreeAsync on the capturing stream
// After the capture the graph itself is destroyed and only its executable
// graph lives: every replay still writes t1's addresses, so an allocator
// that hands t1 to anyone else before the exec is destroyed makes either
// the graph's output or the workers' blocks wrong.  Each replay gets a new
// input and its whole output is checked on the device; each worker checks
// every word of every block it filled.
//
// Usage: graph_capture_temporaries [replays]   (default 300)
// Prints one line per part, "N wrong words" and "graph_capture_temporaries:
// PASS|FAIL" at the end; exit 1 on any wrong word or CUDA error.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "example_checks.cuh"

namespace {

constexpr size_t kWords = 1 << 20;  // 4 MiB temporaries
constexpr int kWorkers = 4;

__global__ void set_input(int* in, size_t n, int round) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    in[i] = static_cast<int>(i) + round;
}
__global__ void times_two(int* t1, const int* in, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) t1[i] = in[i] * 2;
}
__global__ void plus_seven(int* t2, const int* t1, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) t2[i] = t1[i] + 7;
}
__global__ void times_three(int* out, const int* t2, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = t2[i] * 3;
}
__global__ void check_output(const int* out, size_t n, int round, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (out[i] != ((static_cast<int>(i) + round) * 2 + 7) * 3) atomicAdd(wrong, 1ULL);
}
__global__ void fill(int* p, size_t n, int value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value + static_cast<int>(i);
}
__global__ void check_fill(const int* p, size_t n, int value, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != value + static_cast<int>(i)) atomicAdd(wrong, 1ULL);
}

// Under cachalloc (LD_PRELOAD), a plain cudaFree inside the capture keeps
// the block for the graph; bare, it would free memory the graph still uses.
bool under_cachalloc() { return dlsym(RTLD_DEFAULT, "cachalloc_version") != nullptr; }

// Captures the graph on `s`; returns its executable graph (the graph is
// destroyed here: only the exec keeps the temporaries).
cudaGraphExec_t capture(cudaStream_t s, const int* in, int* out, bool plain_temporary) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  int *t1 = nullptr, *t2 = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  if (plain_temporary) CK(cudaMalloc(&t1, kWords * sizeof(int)));
  else CK(cudaMallocAsync(&t1, kWords * sizeof(int), s));
  times_two<<<64, 256, 0, s>>>(t1, in, kWords);
  CK(cudaMallocAsync(&t2, kWords * sizeof(int), s));
  plus_seven<<<64, 256, 0, s>>>(t2, t1, kWords);
  times_three<<<64, 256, 0, s>>>(out, t2, kWords);
  CK(cudaFreeAsync(t2, s));
  if (plain_temporary) CK(cudaFree(t1));
  else CK(cudaFreeAsync(t1, s));
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaGraphDestroy(g));
  return exec;
}

// A worker: blocks of 64 KiB – 8 MiB on its own stream, each filled,
// checked word by word and freed, until `stop`.
void worker(int id, std::atomic<bool>* stop, unsigned long long* wrong, long* blocks) {
  cudaStream_t s;
  if (!CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) return;
  unsigned seed = 1234u + id;
  for (int round = 0; !stop->load(); ++round) {
    seed = seed * 1103515245u + 12345u;
    const size_t words = (size_t(16) << 10) << (seed >> 16) % 8;  // 64 KiB .. 8 MiB
    int* p = nullptr;
    if (!CK(cudaMalloc(&p, words * sizeof(int)))) break;
    const int value = id * 1000003 + round * 7;
    fill<<<32, 256, 0, s>>>(p, words, value);
    check_fill<<<32, 256, 0, s>>>(p, words, value, wrong);
    CK(cudaStreamSynchronize(s));  // the block's last use, then a plain free
    CK(cudaFree(p));
    ++*blocks;
  }
  CK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 300;
  const bool plain = under_cachalloc();
  int *in = nullptr, *out = nullptr;
  unsigned long long* wrong = nullptr;  // [0]: graph, [1..]: workers
  cudaStream_t s;
  if (!CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) || !CK(cudaMalloc(&in, kWords * sizeof(int))) ||
      !CK(cudaMalloc(&out, kWords * sizeof(int))) ||
      !CK(cudaMallocManaged(&wrong, (1 + kWorkers) * sizeof(unsigned long long))))
    return 1;
  for (int i = 0; i <= kWorkers; ++i) wrong[i] = 0;
  std::printf("graph: t1 by %s inside the capture\n",
              plain ? "cudaMalloc/cudaFree (cachalloc keeps it for the graph)"
                    : "cudaMallocAsync/cudaFreeAsync (bare: cudaFree would free it under the graph)");
  cudaGraphExec_t exec = capture(s, in, out, plain);

  std::atomic<bool> stop{false};
  std::vector<long> blocks(kWorkers, 0);
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) workers.emplace_back(worker, w, &stop, &wrong[1 + w], &blocks[w]);
  for (int r = 0; r < replays; ++r) {
    set_input<<<64, 256, 0, s>>>(in, kWords, r);
    CK(cudaGraphLaunch(exec, s));
    check_output<<<64, 256, 0, s>>>(out, kWords, r, &wrong[0]);
    if (r % 16 == 0) CK(cudaStreamSynchronize(s));
  }
  CK(cudaStreamSynchronize(s));
  stop = true;
  for (auto& t : workers) t.join();
  CK(cudaGraphExecDestroy(exec));
  CK(cudaDeviceSynchronize());

  unsigned long long worker_wrong = 0;
  long total_blocks = 0;
  for (int w = 0; w < kWorkers; ++w) worker_wrong += wrong[1 + w], total_blocks += blocks[w];
  std::printf("graph: %d replays, %llu wrong words\n", replays, wrong[0]);
  std::printf("workers: %d threads, %ld blocks, %llu wrong words\n", kWorkers, total_blocks, worker_wrong);
  const unsigned long long total = wrong[0] + worker_wrong;
  std::printf("%llu wrong words, %d CUDA errors\n", total, examples::g_failures.load());
  const bool pass = total == 0 && examples::g_failures.load() == 0;
  std::printf("graph_capture_temporaries: %s\n", pass ? "PASS" : "FAIL");
  CK(cudaFree(wrong));
  CK(cudaFree(in));
  CK(cudaFree(out));
  return pass ? 0 : 1;
}
