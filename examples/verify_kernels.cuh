// verify_kernels.cuh — device-side data checks for the allocation examples.
//
// Every buffer an example gets is filled with a pattern derived from a seed
// (the buffer's address and the iteration), then checked on the device; a
// mismatch count lands in device memory.  A wrong answer from an allocator
// (two live buffers overlapping, memory handed out while a kernel still reads
// it) shows up as mismatches, never as a crash we might not notice.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace examples {

// A cheap integer hash: neighbouring words and neighbouring seeds differ in
// many bits, so a buffer filled for one (address, iteration) never passes the
// check for another.
__host__ __device__ inline std::uint32_t pattern_word(std::uint32_t seed, std::uint64_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(seed) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x);
}

inline std::uint32_t seed_for(const void* p, std::uint32_t iteration) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return static_cast<std::uint32_t>(a >> 8) ^ static_cast<std::uint32_t>(a >> 40) ^
         (iteration * 0x85EBCA6Bu);
}

__global__ void fill_kernel(std::uint32_t* p, std::uint64_t n, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    p[i] = pattern_word(seed, i);
}

__global__ void check_kernel(const std::uint32_t* p, std::uint64_t n, std::uint32_t seed,
                             unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    bad += (p[i] != pattern_word(seed, i));
  if (bad) atomicAdd(mismatches, bad);
}

__device__ inline std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins for `ns` nanoseconds, then checks the buffer: a stand-in for a long
// kernel that still reads memory its host thread has already freed.  Few
// blocks, so kernels on other streams run beside it.
__global__ void spin_then_check_kernel(const std::uint32_t* p, std::uint64_t n, std::uint32_t seed,
                                       std::uint64_t ns, unsigned long long* mismatches) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) {
  }
  unsigned long long bad = 0;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    bad += (p[i] != pattern_word(seed, i));
  if (bad) atomicAdd(mismatches, bad);
}

// Sanitizer-safe mode: `--sanitizer-safe` as the first argument(s), or
// EXAMPLES_SANITIZER_SAFE=1 in the environment.  tests/gpu/run_sanitizer.sh
// runs the examples this way under compute-sanitizer, where every finding
// must be a real one: the examples then leave out what they do wrong on
// purpose (API calls that fail by design: out of memory, attributes of freed
// or host pointers, ranges past an allocation's end; kernels still reading a
// buffer when the host frees it, which is what the fence and late-reader
// patterns measure: the reader is waited for before the free instead).  The
// allocation patterns, sizes and data checks stay the same, so the expected
// count of findings is 0, bare and under cachalloc alike.
inline bool& sanitizer_safe() {
  static bool safe = false;
  return safe;
}

// Removes every `--sanitizer-safe` from argv (argc shrinks) and sets
// sanitizer_safe() from it or from EXAMPLES_SANITIZER_SAFE.
inline void take_sanitizer_safe_flag(int& argc, char** argv) {
  const char* env = std::getenv("EXAMPLES_SANITIZER_SAFE");
  bool safe = env != nullptr && env[0] != '\0' && env[0] != '0';
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sanitizer-safe") == 0)
      safe = true;
    else
      argv[out++] = argv[i];
  }
  argv[out] = nullptr;
  argc = out;
  sanitizer_safe() = safe;
}

inline unsigned grid_for(std::uint64_t n) {
  std::uint64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks ? blocks : 1) : 1024);
}

inline void fill(void* p, std::size_t bytes, std::uint32_t seed, cudaStream_t s) {
  std::uint64_t n = bytes / 4;
  if (n) fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<std::uint32_t*>(p), n, seed);
}

inline void check(const void* p, std::size_t bytes, std::uint32_t seed, cudaStream_t s,
                  unsigned long long* mismatches) {
  std::uint64_t n = bytes / 4;
  if (n) check_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const std::uint32_t*>(p), n, seed, mismatches);
}

}  // namespace examples
