// per_thread_streams.cu — per-thread default streams and plain frees.
//
// Each case frees a block while a slow kernel on a per-thread default
// stream still writes it, allocates the same size again and fills the new
// block from another stream, then checks every word.  The bare driver's
// cudaFree waits for the device, so no word can be wrong; an allocator
// that reuses the block at once without ordering the new work after the old
// kernel gets every word overwritten.
//
//   beside_blocking  one thread: the kernel on its per-thread stream, the
//                    fill on a created blocking stream
//   two_threads      two threads, no created stream: the kernel on the main
//                    thread's per-thread stream, the fill (and the
//                    allocation, before that thread ever launched) on the
//                    second thread's
//
// Built twice: with --default-stream per-thread, where stream 0 is the
// per-thread stream (launches go through the driver's _ptsz entry points),
// and plainly with -DEXPLICIT_PER_THREAD, where the program names
// cudaStreamPerThread.  Usage: per_thread_streams [case]; prints one line
// per case ("name: PASS|FAIL ..."), exit status 0 when all pass.
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#ifdef EXPLICIT_PER_THREAD
#define PER_THREAD cudaStreamPerThread
#else
#define PER_THREAD 0  // the per-thread stream in a --default-stream per-thread build
#endif

namespace {

constexpr size_t kWords = 1 << 20;  // 4 MiB blocks
constexpr int kOld = 1, kNew = 2;

// Spins about `cycles` clock ticks, then writes `value` everywhere: the
// kernel that still uses a block when the program frees it.
__global__ void slow_write(int* p, size_t n, int value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

__global__ void fill(int* p, size_t n, int value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// About 200 ms of spinning at the device's clock.
long long slow_cycles() {
  int khz = 1500000;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  return static_cast<long long>(khz) * 200;
}

// Words of the block at `q` that are not kNew.
long long wrong_words(const int* q) {
  std::vector<int> host(kWords);
  if (!ok(cudaMemcpy(host.data(), q, kWords * sizeof(int), cudaMemcpyDeviceToHost), "copy back")) return -1;
  long long wrong = 0;
  for (int v : host) wrong += v != kNew;
  return wrong;
}

int report(const char* name, long long wrong, bool reused) {
  if (wrong < 0) {
    std::printf("%s: FAIL (a CUDA call failed)\n", name);
    return 1;
  }
  std::printf("%s: %s (%lld of %zu words overwritten by the old kernel; block %s)\n", name, wrong == 0 ? "PASS" : "FAIL",
              wrong, kWords, reused ? "reused" : "not reused");
  return wrong == 0 ? 0 : 1;
}

int beside_blocking() {
  cudaStream_t s;
  int *p = nullptr, *q = nullptr;
  if (!ok(cudaStreamCreate(&s), "stream") || !ok(cudaMalloc(&p, kWords * sizeof(int)), "malloc")) return 1;
  slow_write<<<132, 256, 0, PER_THREAD>>>(p, kWords, kOld, slow_cycles());
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaFree(p), "free")) return 1;
  if (!ok(cudaMalloc(&q, kWords * sizeof(int)), "malloc again")) return 1;
  fill<<<132, 256, 0, s>>>(q, kWords, kNew);
  if (!ok(cudaDeviceSynchronize(), "sync")) return 1;
  const int rc = report("beside_blocking", wrong_words(q), q == p);
  cudaFree(q);
  cudaStreamDestroy(s);
  return rc;
}

int two_threads() {
  int* p = nullptr;
  if (!ok(cudaMalloc(&p, kWords * sizeof(int)), "malloc")) return 1;
  slow_write<<<132, 256, 0, PER_THREAD>>>(p, kWords, kOld, slow_cycles());
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaFree(p), "free")) return 1;
  int* q = nullptr;
  long long wrong = -1;
  std::thread second([&] {
    if (!ok(cudaMalloc(&q, kWords * sizeof(int)), "malloc in thread")) return;
    fill<<<132, 256, 0, PER_THREAD>>>(q, kWords, kNew);
    if (!ok(cudaStreamSynchronize(PER_THREAD), "sync in thread")) return;
    wrong = wrong_words(q);
  });
  second.join();
  cudaDeviceSynchronize();
  const int rc = report("two_threads", wrong, q == p);
  cudaFree(q);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("per_thread_streams: SKIP (no GPU)\n");
    return 77;
  }
  const char* only = argc > 1 ? argv[1] : nullptr;
  int failed = 0;
  if (only == nullptr || std::strcmp(only, "beside_blocking") == 0) failed += beside_blocking();
  if (only == nullptr || std::strcmp(only, "two_threads") == 0) failed += two_threads();
  std::printf("per_thread_streams: %s\n", failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? 0 : 1;
}
