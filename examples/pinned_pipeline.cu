// pinned_pipeline.cu — pinned host memory in the patterns real programs use,
// with every byte verified on the device, and timed.  Built twice (static
// cudart and -cudart shared) and run with and without libcachalloc.so
// preloaded: the program must pass both ways, so it checks the driver's
// semantics, not cachalloc's own rules (docs/HOST.md).
//
// Patterns:
//   pipeline  host producer threads, each with its own stream: allocate a
//             pinned buffer (cudaHostAlloc), fill it on the host, copy it
//             to the device asynchronously, check it there with a kernel,
//             and free the pinned buffer (cudaFreeHost) right after
//             enqueuing — while the copy may still be reading it.  A cache
//             that handed the buffer out again before the copy completed
//             would let another producer overwrite it: mismatches.
//   slow_copy the same, one stream held behind a 100 ms kernel so that the
//             copy certainly runs after the free; another thread allocates
//             the same size at once and writes its own pattern.
//   d2h       device fills, copies back into pinned buffers, the host checks.
//   mapped    cudaHostAllocMapped: a kernel writes through the device alias
//             (cudaHostGetDevicePointer), the host reads; flags and pointer
//             attributes as the driver gives them; a freed and reallocated
//             block answers for its new size.
//   flags     portable / write-combined / mapped blocks keep their flags.
//   errors    cudaFreeHost twice, of an interior pointer, of malloc'ed and
//             of cudaHostRegister'ed memory: the driver's errors.
//   bench     time per cudaHostAlloc+cudaFreeHost pair, 4 KiB .. 256 MiB
//             (and per cudaMallocHost pair at 1 MiB): one line per size,
//             `pinned_pair <bytes> <microseconds per pair> <pairs>`.
// Prints one line per pattern and finally `pinned_pipeline: PASS` (exit 0)
// or `pinned_pipeline: FAIL ...` (exit 1); exit 77 when no GPU can be used.
// `pinned_pipeline PATTERN...` runs only the named patterns.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "example_checks.cuh"
#include "verify_kernels.cuh"

namespace {

using examples::pattern_word;

constexpr std::size_t KiB = 1024, MiB = KiB * KiB;
constexpr std::uint64_t kSpinNs = 100'000'000;  // the "long kernel": 100 ms

using examples::fail;
using examples::g_failures;
using examples::ok;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void report(const char* name, int failures_before, const std::string& detail) {
  std::printf("  %-10s %-4s %s\n", name, g_failures.load() == failures_before ? "ok" : "FAIL", detail.c_str());
  std::fflush(stdout);
}

// Host side of the pattern of verify_kernels.cuh.
void host_fill(void* p, std::size_t bytes, std::uint32_t seed) {
  auto* w = static_cast<std::uint32_t*>(p);
  for (std::uint64_t i = 0; i < bytes / 4; ++i) w[i] = pattern_word(seed, i);
}

std::uint64_t host_mismatches(const void* p, std::size_t bytes, std::uint32_t seed) {
  const auto* w = static_cast<const std::uint32_t*>(p);
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < bytes / 4; ++i) bad += w[i] != pattern_word(seed, i);
  return bad;
}

__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = examples::global_ns();
  while (examples::global_ns() - start < ns) {
  }
}

__global__ void write_through_alias(std::uint32_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    p[i] = examples::pattern_word(seed, i);
}

// ---------------------------------------------------------------- pipeline

struct Producer {
  cudaStream_t stream = nullptr;
  void* device = nullptr;             // one device buffer per in-flight slot
  unsigned long long* mismatches = nullptr;  // device counter
};

// Each producer owns a stream and `kSlots` device buffers; every iteration
// allocates a pinned buffer, fills it, copies it, checks it on the device,
// and frees the pinned buffer without waiting for the copy.
void produce(Producer& p, int id, int iterations, std::size_t max_bytes) {
  constexpr int kSlots = 4;
  for (int it = 0; it < iterations; ++it) {
    const std::size_t bytes = max_bytes >> (it % 3);  // three sizes, three classes
    void* host = nullptr;
    if (!CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault))) return;
    const std::uint32_t seed = static_cast<std::uint32_t>(id * 1000003 + it);
    host_fill(host, bytes, seed);
    char* dev = static_cast<char*>(p.device) + (it % kSlots) * max_bytes;
    CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, p.stream));
    examples::check(dev, bytes, seed, p.stream, p.mismatches);
    CK(cudaFreeHost(host));  // the copy may still be reading it
  }
}

void run_producers(const char* name, int threads, int iterations, std::size_t max_bytes, bool slow_first) {
  const int before = g_failures.load();
  std::vector<Producer> producers(threads);
  for (Producer& p : producers) {
    CK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&p.device, 4 * max_bytes));
    CK(cudaMalloc(&p.mismatches, sizeof(unsigned long long)));
    CK(cudaMemset(p.mismatches, 0, sizeof(unsigned long long)));
  }
  CK(cudaDeviceSynchronize());
  // slow_copy: producer 0's stream runs a 100 ms kernel first, so its copies
  // run long after its frees.
  if (slow_first) spin_kernel<<<1, 1, 0, producers[0].stream>>>(kSpinNs);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { produce(producers[t], t, iterations, max_bytes); });
  for (auto& th : pool) th.join();
  const double enqueue_s = seconds_since(t0);
  CK(cudaDeviceSynchronize());
  const double total_s = seconds_since(t0);
  unsigned long long bad = 0;
  for (Producer& p : producers) {
    unsigned long long m = 0;
    CK(cudaMemcpy(&m, p.mismatches, sizeof m, cudaMemcpyDeviceToHost));
    bad += m;
    CK(cudaFree(p.device));
    CK(cudaFree(p.mismatches));
    CK(cudaStreamDestroy(p.stream));
  }
  if (bad != 0) fail("%s: %llu words differ from what the producers wrote", name, bad);
  char detail[160];
  std::snprintf(detail, sizeof detail, "%d threads x %d buffers up to %zu KiB: enqueue %.3f s, total %.3f s", threads,
                iterations, max_bytes / KiB, enqueue_s, total_s);
  report(name, before, detail);
}

void pipeline() { run_producers("pipeline", 4, 200, 4 * MiB, false); }
void slow_copy() { run_producers("slow_copy", 2, 50, 1 * MiB, true); }

// ---------------------------------------------------------------- d2h

void d2h() {
  const int before = g_failures.load();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* dev = nullptr;
  CK(cudaMalloc(&dev, 8 * MiB));
  std::uint64_t bad = 0;
  for (int it = 0; it < 50; ++it) {
    const std::size_t bytes = (it % 2 ? 8 * MiB : 3 * MiB + 12);
    void* host = nullptr;
    if (!CK(cudaMallocHost(&host, bytes))) break;
    std::memset(host, 0xEE, bytes);
    const std::uint32_t seed = 77u + it;
    examples::fill(dev, bytes, seed, s);
    CK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    bad += host_mismatches(host, bytes & ~std::size_t{3}, seed);
    CK(cudaFreeHost(host));
  }
  if (bad != 0) fail("d2h: %llu words differ", static_cast<unsigned long long>(bad));
  CK(cudaFree(dev));
  CK(cudaStreamDestroy(s));
  report("d2h", before, "50 round trips through cudaMallocHost buffers");
}

// ---------------------------------------------------------------- mapped

void mapped() {
  const int before = g_failures.load();
  const std::size_t bytes = 100 * KiB + 4;
  void* host = nullptr;
  CK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
  unsigned flags = 0;
  CK(cudaHostGetFlags(&flags, host));
  if (!(flags & cudaHostAllocMapped)) fail("mapped: cudaHostGetFlags = %#x, no cudaHostAllocMapped", flags);
  void* alias = nullptr;
  CK(cudaHostGetDevicePointer(&alias, host, 0));
  write_through_alias<<<examples::grid_for(bytes / 4), 256>>>(static_cast<std::uint32_t*>(alias), bytes / 4, 99);
  CK(cudaDeviceSynchronize());
  const std::uint64_t bad = host_mismatches(host, bytes, 99);
  if (bad != 0) fail("mapped: %llu words written through the alias differ", static_cast<unsigned long long>(bad));
  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, static_cast<char*>(host) + 64));
  if (attr.type != cudaMemoryTypeHost) fail("mapped: pointer type %d, not host", static_cast<int>(attr.type));
  if (attr.hostPointer != static_cast<char*>(host) + 64) fail("mapped: hostPointer is not the address asked");
  CK(cudaFreeHost(host));
  // A new allocation of the same size class: flags and alias of its own.
  void* again = nullptr;
  CK(cudaHostAlloc(&again, bytes - 1000, cudaHostAllocMapped));
  void* alias2 = nullptr;
  CK(cudaHostGetDevicePointer(&alias2, again, 0));
  write_through_alias<<<examples::grid_for((bytes - 1000) / 4), 256>>>(static_cast<std::uint32_t*>(alias2),
                                                                        (bytes - 1000) / 4, 5);
  CK(cudaDeviceSynchronize());
  if (host_mismatches(again, bytes - 1000, 5) != 0) fail("mapped: the reallocated block's alias is wrong");
  CK(cudaFreeHost(again));
  report("mapped", before, "device writes through cudaHostGetDevicePointer, host reads");
}

// ---------------------------------------------------------------- flags

void flags() {
  const int before = g_failures.load();
  const unsigned kinds[] = {cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocMapped,
                            cudaHostAllocWriteCombined, cudaHostAllocMapped | cudaHostAllocWriteCombined};
  for (int round = 0; round < 3; ++round)
    for (unsigned k : kinds) {
      void* p = nullptr;
      if (!CK(cudaHostAlloc(&p, 256 * KiB, k))) continue;
      unsigned got = 0;
      CK(cudaHostGetFlags(&got, p));
      // The driver may add portable|mapped (unified addressing); it never
      // drops a flag that was asked for.
      if ((got & k) != k) fail("flags: asked %#x, cudaHostGetFlags says %#x", k, got);
      CK(cudaFreeHost(p));
    }
  report("flags", before, "default, portable, mapped, write-combined, three rounds");
}

// ---------------------------------------------------------------- errors

void errors() {
  const int before = g_failures.load();
  void* p = nullptr;
  CK(cudaHostAlloc(&p, 64 * KiB, 0));
  if (cudaFreeHost(static_cast<char*>(p) + 16) == cudaSuccess) fail("errors: an interior pointer was freed");
  cudaGetLastError();
  CK(cudaFreeHost(p));
  if (cudaFreeHost(p) == cudaSuccess) fail("errors: a double free succeeded");
  cudaGetLastError();
  void* mine = std::aligned_alloc(4096, 64 * KiB);
  if (cudaFreeHost(mine) == cudaSuccess) fail("errors: cudaFreeHost of malloc'ed memory succeeded");
  cudaGetLastError();
  CK(cudaHostRegister(mine, 64 * KiB, cudaHostRegisterDefault));
  if (cudaFreeHost(mine) == cudaSuccess) fail("errors: cudaFreeHost of registered memory succeeded");
  cudaGetLastError();
  CK(cudaHostUnregister(mine));
  std::free(mine);
  report("errors", before, "double free, interior, malloc'ed and registered pointers refused");
}

// ---------------------------------------------------------------- bench

void bench() {
  const int before = g_failures.load();
  for (std::size_t bytes = 4 * KiB; bytes <= 256 * MiB; bytes *= 4) {
    const int pairs = bytes <= MiB ? 200 : bytes <= 16 * MiB ? 20 : 4;
    void* warm = nullptr;  // the first pair of a size may pay for page faults
    if (!CK(cudaHostAlloc(&warm, bytes, 0))) break;
    CK(cudaFreeHost(warm));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) {
      void* p = nullptr;
      if (!CK(cudaHostAlloc(&p, bytes, 0))) break;
      static_cast<volatile char*>(p)[0] = 1;
      CK(cudaFreeHost(p));
    }
    std::printf("  pinned_pair %zu %.2f %d\n", bytes, 1e6 * seconds_since(t0) / pairs, pairs);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    void* p = nullptr;
    if (!CK(cudaMallocHost(&p, MiB))) break;
    CK(cudaFreeHost(p));
  }
  std::printf("  pinned_pair_mallochost %zu %.2f %d\n", MiB, 1e6 * seconds_since(t0) / 200, 200);
  report("bench", before, "microseconds per pair above");
}

struct Pattern {
  const char* name;
  void (*run)();
};
const Pattern kPatterns[] = {{"pipeline", pipeline}, {"slow_copy", slow_copy}, {"d2h", d2h}, {"mapped", mapped},
                             {"flags", flags},       {"errors", errors},       {"bench", bench}};

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("pinned_pipeline: SKIP (no GPU)\n");
    return 77;
  }
  CK(cudaSetDevice(0));
  const auto t0 = std::chrono::steady_clock::now();
  for (const Pattern& p : kPatterns) {
    bool wanted = argc < 2;
    for (int i = 1; i < argc; ++i) wanted |= std::strcmp(argv[i], p.name) == 0;
    if (wanted) p.run();
  }
  const int failures = g_failures.load();
  std::printf("  total %.3f s\n", seconds_since(t0));
  if (failures == 0) {
    std::printf("pinned_pipeline: PASS\n");
    return 0;
  }
  std::printf("pinned_pipeline: FAIL (%d checks failed)\n", failures);
  return 1;
}
