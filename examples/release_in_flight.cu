// release_in_flight.cu — memory given back while a kernel still uses it.
//
// Each case frees a block while a slow kernel on the block's stream still
// runs (it spins, then writes the whole block and a done flag), and then
// makes the allocator give cached memory back to the driver.  The bare
// driver keeps the freed block's memory until the kernel ends; an allocator
// that unmaps the pages at once (cuMemUnmap does not wait for the device as
// cuMemFree does) makes the kernel fault, and every later call of the
// program fails with an illegal address.
//
//   async_oom       cudaMallocAsync/cudaFreeAsync on a non-blocking stream,
//                   then a cudaMalloc larger than the device: an allocator
//                   releases what it caches before it reports the failure
//   plain_free_oom  cudaMalloc/cudaFree with the kernel on the legacy
//                   stream (cudaFree may return before the kernel ends
//                   under an allocator), then the same oversized cudaMalloc
//   empty_cache     cachalloc_empty_cache() (found with dlsym; SKIP when no
//                   cachalloc is loaded) after a cudaFreeAsync
//   other_stream    after the cudaFreeAsync, a new peak on a second stream:
//                   cudaMallocAsync there, a fill of the block on that
//                   stream, and every word read back once both kernels
//                   ended.  An allocator that hands the freed memory to the
//                   new block (release_before_peak, release_remap) must
//                   order the fill after the slow kernel's writes, or the
//                   slow kernel's words show through.
//
// Run it bare, under LD_PRELOAD=libcachalloc.so, and with
// CACHALLOC_CONF=expandable_segments:true (whose cached pages are unmapped
// on release), also with release_before_peak:true[,release_remap:true].  Usage: release_in_flight [case]; one line per case, exit
// status 0 when all pass.  A fault ends the program at the failing case:
// the context is unusable after it.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

namespace {

constexpr size_t kBytes = 64u << 20;  // large pool: pages unmapped on release

// Spins about `cycles` clock ticks, then writes every word of `p` and sets
// *done: a kernel that still uses the block when the program frees it.
__global__ void slow_write(unsigned* p, size_t n, long long cycles, unsigned* done) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 0x5a5a5a5a;
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(done, 1u);
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("    %s: %s\n", what, cudaGetErrorName(e));
  return false;
}

// About 300 ms of spinning at the device's clock.
long long slow_cycles() {
  int khz = 1500000;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  return static_cast<long long>(khz) * 300;
}

// Asks for more than the device has: the refusal is expected, and on the
// way an allocator releases the memory it caches.
bool oversized_request() {
  size_t free_b = 0, total = 0;
  if (!ok(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo")) return false;
  void* big = nullptr;
  const cudaError_t e = cudaMalloc(&big, total * 2);
  if (e == cudaSuccess) {
    std::printf("    cudaMalloc of twice the device succeeded\n");
    cudaFree(big);
    return false;
  }
  cudaGetLastError();  // the refusal is not sticky; clear it
  return e == cudaErrorMemoryAllocation || ok(e, "oversized cudaMalloc");
}

// The kernel ended without a fault and set its flag once.
bool kernel_finished(unsigned* done, cudaStream_t s) {
  if (!ok(cudaStreamSynchronize(s), "synchronize the kernel's stream")) return false;
  if (!ok(cudaDeviceSynchronize(), "synchronize the device")) return false;
  unsigned host = 0;
  if (!ok(cudaMemcpy(&host, done, sizeof host, cudaMemcpyDeviceToHost), "copy the flag back")) return false;
  if (host != 1) std::printf("    done flag %u, expected 1\n", host);
  return host == 1;
}

using EmptyCacheFn = int (*)(int);

// One case: allocate, launch, free, release, check.  `release` returns false
// when the case cannot run here (SKIP).
int run_case(const char* name, bool async, cudaStream_t s, bool (*release)(), unsigned* done) {
  unsigned* p = nullptr;
  bool fine = ok(cudaMemset(done, 0, sizeof *done), "clear the flag");
  fine = fine && (async ? ok(cudaMallocAsync(&p, kBytes, s), "cudaMallocAsync") : ok(cudaMalloc(&p, kBytes), "cudaMalloc"));
  if (fine) {
    slow_write<<<132, 256, 0, s>>>(p, kBytes / sizeof(unsigned), slow_cycles(), done);
    fine = ok(cudaGetLastError(), "launch");
  }
  fine = fine && (async ? ok(cudaFreeAsync(p, s), "cudaFreeAsync") : ok(cudaFree(p), "cudaFree"));
  fine = fine && release() && kernel_finished(done, s);
  std::printf("%s: %s\n", name, fine ? "PASS" : "FAIL");
  return fine ? 0 : 1;
}

__global__ void fill(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

// other_stream: the freed block's memory may serve stream t's new block; the
// fill on t must land after the slow kernel's writes.
int run_other_stream(cudaStream_t s, cudaStream_t t, unsigned* done) {
  constexpr unsigned kFill = 0x3c3c3c3c;
  const size_t n = kBytes / sizeof(unsigned);
  unsigned *p = nullptr, *q = nullptr;
  bool fine = ok(cudaMemset(done, 0, sizeof *done), "clear the flag") && ok(cudaMallocAsync(&p, kBytes, s), "cudaMallocAsync");
  if (fine) {
    slow_write<<<132, 256, 0, s>>>(p, n, slow_cycles(), done);
    fine = ok(cudaGetLastError(), "launch");
  }
  fine = fine && ok(cudaFreeAsync(p, s), "cudaFreeAsync") && ok(cudaMallocAsync(&q, kBytes, t), "cudaMallocAsync on t");
  if (fine) {
    fill<<<132, 256, 0, t>>>(q, n, kFill);
    fine = ok(cudaGetLastError(), "launch the fill");
  }
  fine = fine && ok(cudaStreamSynchronize(t), "synchronize t") && kernel_finished(done, s);
  size_t wrong = 0;
  if (fine) {
    unsigned* host = new unsigned[n];
    fine = ok(cudaMemcpy(host, q, kBytes, cudaMemcpyDeviceToHost), "copy the block back");
    for (size_t i = 0; fine && i < n; ++i) wrong += host[i] != kFill;
    delete[] host;
    if (wrong != 0) std::printf("    %zu of %zu words are not the fill\n", wrong, n);
  }
  fine = fine && wrong == 0 && ok(cudaFreeAsync(q, t), "cudaFreeAsync on t") && ok(cudaStreamSynchronize(t), "sync");
  std::printf("other_stream: %s\n", fine ? "PASS" : "FAIL");
  return fine ? 0 : 1;
}

bool empty_cache() {
  auto fn = reinterpret_cast<EmptyCacheFn>(dlsym(RTLD_DEFAULT, "cachalloc_empty_cache"));
  return fn != nullptr && fn(-1) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("release_in_flight: SKIP (no GPU)\n");
    return 77;
  }
  const char* only = argc > 1 ? argv[1] : nullptr;
  auto wanted = [&](const char* name) { return only == nullptr || std::strcmp(only, name) == 0; };
  cudaStream_t s;
  unsigned* done = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") ||
      !ok(cudaMalloc(&done, sizeof *done), "flag"))
    return 1;
  int failed = 0;
  if (wanted("async_oom")) failed += run_case("async_oom", true, s, oversized_request, done);
  if (failed == 0 && wanted("plain_free_oom")) failed += run_case("plain_free_oom", false, 0, oversized_request, done);
  if (failed == 0 && wanted("empty_cache")) {
    if (dlsym(RTLD_DEFAULT, "cachalloc_empty_cache") == nullptr) std::printf("empty_cache: SKIP (no cachalloc loaded)\n");
    else failed += run_case("empty_cache", true, s, empty_cache, done);
  }
  if (failed == 0 && wanted("other_stream")) {
    cudaStream_t t;
    if (!ok(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), "stream t")) return 1;
    failed += run_other_stream(s, t, done);
  }
  std::printf("release_in_flight: %s\n", failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? 0 : 1;
}
