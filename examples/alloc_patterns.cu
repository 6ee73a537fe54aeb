// alloc_patterns.cu — allocates and frees device memory through the CUDA
// runtime in the patterns real programs use, and verifies every byte with
// kernels.  Built twice (static cudart, nvcc's default, and -cudart shared)
// and run with and without libcachalloc.so preloaded: the program must pass
// both ways, so it checks the driver's semantics, not cachalloc's own rules.
//
// Patterns: many sizes with reuse; cudaFree while a kernel on another stream
// still reads the buffer (the freed memory must not be handed out before that
// kernel is done); cudaMallocAsync/cudaFreeAsync on several streams; graph
// capture with allocations inside (graph memory nodes); several host threads;
// cudaMemGetInfo; out of memory on purpose, then allocating again.
//
// Prints one line per pattern and finally `alloc_patterns: PASS` (exit 0) or
// `alloc_patterns: FAIL ...` (exit 1).  Exit 77 when no GPU can be used.
//
// --sanitizer-safe (verify_kernels.cuh; tests/gpu/run_sanitizer.sh): the
// fence patterns wait for the reader before each cudaFree (the same
// allocations, without the free during the kernel) and oom, whose failing
// calls are the point, is left out.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "example_checks.cuh"
#include "verify_kernels.cuh"

namespace {

using examples::fill;
using examples::check;
using examples::seed_for;

constexpr std::size_t KiB = 1024, MiB = KiB * KiB, GiB = MiB * KiB;
constexpr std::uint64_t kSpinNs = 100'000'000;  // the "long kernel": 100 ms

using examples::fail;
using examples::g_failures;
using examples::ok;

// Mismatch counters live in mapped pinned host memory, so reading them does
// not depend on the allocator under test.
struct Counters {
  unsigned long long* slots = nullptr;
  int next = 0;
  static constexpr int kSlots = 1024;  // more than any pattern takes, so none alias
  bool init() {
    if (!CK(cudaHostAlloc(&slots, kSlots * sizeof(*slots), cudaHostAllocMapped))) return false;
    std::fill(slots, slots + kSlots, 0ull);
    return true;
  }
  unsigned long long* take() { return &slots[next++ % kSlots]; }
};
Counters g_counters;

// Sums what a pattern's check kernels counted; call after synchronizing.
struct MismatchTally {
  std::vector<unsigned long long*> used;
  unsigned long long* take() {
    unsigned long long* c = g_counters.take();
    *c = 0;
    used.push_back(c);
    return c;
  }
  unsigned long long total() const {
    unsigned long long t = 0;
    for (auto* c : used) t += *c;
    return t;
  }
};

void report(const char* name, int failures_before, const char* fmt, ...) {
  char detail[256];
  std::va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  std::printf("  %-9s %-4s %s\n", name, g_failures.load() == failures_before ? "ok" : "FAIL", detail);
  std::fflush(stdout);
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 256 == 0; }

struct Buf {
  void* p;
  std::size_t bytes;
};

void check_disjoint(std::vector<Buf> bufs) {
  std::sort(bufs.begin(), bufs.end(), [](const Buf& a, const Buf& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < bufs.size(); ++i)
    if (static_cast<char*>(bufs[i - 1].p) + bufs[i - 1].bytes > bufs[i].p)
      fail("live buffers overlap: %p+%zu and %p", bufs[i - 1].p, bufs[i - 1].bytes, bufs[i].p);
}

// --- many sizes, three rounds, freed in mixed order so blocks get reused ---
void pattern_sizes() {
  const int before = g_failures.load();
  const std::size_t sizes[] = {512, 1000, 4 * KiB, 64 * KiB + 4, MiB, 2 * MiB + 28,
                               10 * MiB, 64 * MiB, 256 * MiB};
  const int kRounds = 3;
  MismatchTally tally;
  int count = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Buf> bufs;
    for (std::size_t bytes : sizes) {
      void* p = nullptr;
      if (!CK(cudaMalloc(&p, bytes))) continue;
      if (!aligned(p)) fail("cudaMalloc(%zu) = %p is not 256-byte aligned", bytes, p);
      fill(p, bytes, seed_for(p, round), 0);
      bufs.push_back({p, bytes});
      ++count;
    }
    check_disjoint(bufs);
    for (const Buf& b : bufs) check(b.p, b.bytes, seed_for(b.p, round), 0, tally.take());
    for (std::size_t i = 1; i < bufs.size(); i += 2) CK(cudaFree(bufs[i].p));
    for (std::size_t i = 0; i < bufs.size(); i += 2) CK(cudaFree(bufs[i].p));
  }
  CK(cudaFree(nullptr));
  CK(cudaDeviceSynchronize());
  if (tally.total()) fail("sizes: %llu words differed from what was written", tally.total());
  report("sizes", before, "%d buffers, 512 B .. 256 MiB, %d rounds", count, kRounds);
}

// --- cudaFree while a kernel on another stream still reads the buffer ---
// cudaFree synchronizes the device, so a program may free a buffer a kernel is
// still reading.  We free, allocate the same size again at once and write new
// data on a third stream: if the freed memory were handed out before the long
// kernel finished, that kernel would see the new data.
void fence_once(cudaStream_t reader, cudaStream_t writer, std::size_t bytes, int rep,
                MismatchTally& tally, int* reused, double* free_ms) {
  void* x = nullptr;
  if (!CK(cudaMalloc(&x, bytes))) return;
  const std::uint32_t old_seed = seed_for(x, 100 + rep);
  fill(x, bytes, old_seed, reader);
  CK(cudaStreamSynchronize(reader));
  unsigned long long* seen = tally.take();
  examples::spin_then_check_kernel<<<4, 256, 0, reader>>>(
      static_cast<const std::uint32_t*>(x), bytes / 4, old_seed, kSpinNs, seen);
  // Sanitizer-safe: the reader is done before the free (memcheck would see
  // a kernel reading memory that the host has freed).
  if (examples::sanitizer_safe()) CK(cudaStreamSynchronize(reader));
  auto t0 = std::chrono::steady_clock::now();
  CK(cudaFree(x));
  *free_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  void* y[4] = {};
  bool reused_here = false;
  for (int k = 0; k < 4; ++k) {
    if (!CK(cudaMalloc(&y[k], bytes))) continue;
    if (y[k] == x) ++*reused, reused_here = true;
    fill(y[k], bytes, seed_for(y[k], 200 + k), writer);
    check(y[k], bytes, seed_for(y[k], 200 + k), writer, tally.take());
  }
  CK(cudaStreamSynchronize(writer));
  CK(cudaStreamSynchronize(reader));
  if (*seen)
    fail("fence: reader on the %s stream, %zu bytes, rep %d: the kernel saw %llu words written "
         "after its buffer was freed (freed address handed out again at once: %s)",
         reader ? "non-blocking" : "legacy", bytes, rep, *seen, reused_here ? "yes" : "no");
  for (void* p : y) if (p) CK(cudaFree(p));
}

void pattern_fence() {
  const int before = g_failures.load();
  cudaStream_t a = nullptr, b = nullptr;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  MismatchTally tally;
  int reused = 0, cases = 0;
  double free_ms = 0;
  const std::size_t sizes[] = {4 * KiB, MiB, 20 * MiB};
  cudaStream_t readers[] = {a, 0};  // a non-blocking stream, then the legacy stream
  for (cudaStream_t reader : readers)
    for (std::size_t bytes : sizes)
      for (int rep = 0; rep < 2; ++rep, ++cases) fence_once(reader, b, bytes, rep, tally, &reused, &free_ms);
  CK(cudaDeviceSynchronize());
  CK(cudaStreamDestroy(a));
  CK(cudaStreamDestroy(b));
  report("fence", before, "%d frees during a 100 ms kernel; address reused at once %d times; "
         "mean cudaFree %.2f ms", cases, reused, free_ms / cases);
}

// --- the same with blocking streams only: cachalloc's default then fences
// each free with one event on the legacy stream instead of synchronizing,
// so cudaFree returns at once and the freed block waits for the reader ---
void pattern_fence_blocking() {
  const int before = g_failures.load();
  cudaStream_t a = nullptr, b = nullptr;
  CK(cudaStreamCreate(&a));
  CK(cudaStreamCreate(&b));
  MismatchTally tally;
  int reused = 0, cases = 0;
  double free_ms = 0;
  const std::size_t sizes[] = {4 * KiB, MiB, 20 * MiB};
  for (std::size_t bytes : sizes)
    for (int rep = 0; rep < 2; ++rep, ++cases) fence_once(a, b, bytes, rep, tally, &reused, &free_ms);
  CK(cudaDeviceSynchronize());
  CK(cudaStreamDestroy(a));
  CK(cudaStreamDestroy(b));
  report("fence_blocking", before, "%d frees during a 100 ms kernel on a blocking stream; address reused at "
         "once %d times; mean cudaFree %.2f ms", cases, reused, free_ms / cases);
}

// --- cudaMallocAsync / cudaFreeAsync on several streams ---
void pattern_async() {
  const int before = g_failures.load();
  cudaStream_t s[3] = {};
  for (auto& st : s) CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  MismatchTally tally;
  const std::size_t sizes[] = {512, 3000, 64 * KiB, MiB + 512, 8 * MiB, 48 * MiB};
  std::vector<Buf> live[3];
  int n = 0;
  for (int i = 0; i < 300; ++i, ++n) {  // same-stream reuse, a few blocks live per stream
    const int k = i % 3;
    const std::size_t bytes = sizes[(i * 7) % 6];
    void* p = nullptr;
    if (!CK(cudaMallocAsync(&p, bytes, s[k]))) continue;
    if (!aligned(p)) fail("cudaMallocAsync(%zu) = %p is not 256-byte aligned", bytes, p);
    fill(p, bytes, seed_for(p, i), s[k]);
    check(p, bytes, seed_for(p, i), s[k], tally.take());
    live[k].push_back({p, bytes});
    if (live[k].size() > 4) {
      CK(cudaFreeAsync(live[k].front().p, s[k]));
      live[k].erase(live[k].begin());
    }
  }
  for (int k = 0; k < 3; ++k)
    for (const Buf& b : live[k]) CK(cudaFreeAsync(b.p, s[k]));
  // Cross-stream: free on s1 behind a long reader, allocate on s2 at once.
  for (int rep = 0; rep < 3; ++rep) {
    const std::size_t bytes = rep == 0 ? 4 * KiB : 16 * MiB;
    void* x = nullptr;
    if (!CK(cudaMallocAsync(&x, bytes, s[0]))) continue;
    const std::uint32_t old_seed = seed_for(x, 300 + rep);
    fill(x, bytes, old_seed, s[0]);
    CK(cudaStreamSynchronize(s[0]));
    examples::spin_then_check_kernel<<<4, 256, 0, s[1]>>>(
        static_cast<const std::uint32_t*>(x), bytes / 4, old_seed, kSpinNs, tally.take());
    CK(cudaFreeAsync(x, s[1]));
    void* y = nullptr;
    if (CK(cudaMallocAsync(&y, bytes, s[2]))) {
      fill(y, bytes, seed_for(y, 400 + rep), s[2]);
      check(y, bytes, seed_for(y, 400 + rep), s[2], tally.take());
      CK(cudaFreeAsync(y, s[2]));
    }
    CK(cudaDeviceSynchronize());
  }
  // Hand-off through an event: written on s0, read and freed on s1.
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  for (int i = 0; i < 20; ++i, ++n) {
    void* p = nullptr;
    const std::size_t bytes = sizes[i % 6];
    if (!CK(cudaMallocAsync(&p, bytes, s[0]))) continue;
    fill(p, bytes, seed_for(p, 500 + i), s[0]);
    CK(cudaEventRecord(ev, s[0]));
    CK(cudaStreamWaitEvent(s[1], ev, 0));
    check(p, bytes, seed_for(p, 500 + i), s[1], tally.take());
    CK(cudaFreeAsync(p, s[1]));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaEventDestroy(ev));
  if (tally.total()) fail("async: %llu words differed from what was written", tally.total());
  for (auto st : s) CK(cudaStreamDestroy(st));
  report("async", before, "%d stream-ordered allocations on 3 streams, 3 cross-stream frees "
         "behind a 100 ms kernel", n + 3);
}

// --- graph capture: allocations inside the capture become graph memory nodes ---
void pattern_graph() {
  const int before = g_failures.load();
  cudaStream_t s = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  MismatchTally tally;
  void* outside = nullptr;  // an ordinary allocation the graph also writes
  CK(cudaMalloc(&outside, MiB));
  unsigned long long* inner = tally.take();
  void *p = nullptr, *q = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  // compute-sanitizer's memcheck tracks graph allocations by address: when q
  // reuses the range of p (freed earlier in the same graph, which CUDA
  // allows), it reports p's own writes past q's end as out of bounds, bare as
  // under cachalloc.  In sanitizer-safe mode p is freed after q is allocated,
  // so the two never share addresses.
  const bool late_free_p = examples::sanitizer_safe();
  const bool alloc_p = CK(cudaMallocAsync(&p, 8 * MiB, s));
  if (alloc_p) {
    fill(p, 8 * MiB, seed_for(p, 600), s);
    check(p, 8 * MiB, seed_for(p, 600), s, inner);
    if (!late_free_p) CK(cudaFreeAsync(p, s));
  }
  const bool alloc_q = CK(cudaMallocAsync(&q, 4 * MiB, s));  // outlives each launch
  if (alloc_p && late_free_p) CK(cudaFreeAsync(p, s));
  if (alloc_q) fill(q, 4 * MiB, seed_for(q, 601), s);
  fill(outside, MiB, seed_for(outside, 602), s);
  CK(cudaStreamEndCapture(s, &graph));
  const int kLaunches = 3;
  if (graph && alloc_q && CK(cudaGraphInstantiate(&exec, graph, 0))) {
    for (int i = 0; i < kLaunches; ++i) {
      CK(cudaGraphLaunch(exec, s));
      check(q, 4 * MiB, seed_for(q, 601), s, tally.take());
      check(outside, MiB, seed_for(outside, 602), s, tally.take());
      CK(cudaFreeAsync(q, s));  // a graph allocation freed outside the graph
      CK(cudaStreamSynchronize(s));
    }
  }
  CK(cudaDeviceSynchronize());
  if (tally.total()) fail("graph: %llu words differed from what was written", tally.total());
  if (exec) CK(cudaGraphExecDestroy(exec));
  if (graph) CK(cudaGraphDestroy(graph));
  CK(cudaFree(outside));
  CK(cudaStreamDestroy(s));
  report("graph", before, "captured cudaMallocAsync/cudaFreeAsync, %d launches, graph memory "
         "freed outside the graph", kLaunches);
}

// --- several host threads, each with its own stream ---
void pattern_threads() {
  const int before = g_failures.load();
  constexpr int kThreads = 4, kIters = 100;
  MismatchTally tally;
  std::vector<unsigned long long*> slots;
  for (int t = 0; t < kThreads * kIters; ++t) slots.push_back(tally.take());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &slots] {
      cudaStream_t s = nullptr;
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (int i = 0; i < kIters; ++i) {
        const std::size_t bytes = (512u << ((t + i) % 14)) + 256 * (i % 3);
        void* p = nullptr;
        if (!CK(cudaMalloc(&p, bytes))) continue;
        fill(p, bytes, seed_for(p, i), s);
        check(p, bytes, seed_for(p, i), s, slots[t * kIters + i]);
        CK(cudaStreamSynchronize(s));
        CK(cudaFree(p));
      }
      CK(cudaStreamDestroy(s));
    });
  for (auto& th : threads) th.join();
  CK(cudaDeviceSynchronize());
  if (tally.total()) fail("threads: %llu words differed from what was written", tally.total());
  report("threads", before, "%d threads x %d cudaMalloc/cudaFree, 512 B .. 4 MiB", kThreads, kIters);
}

// --- cudaMemGetInfo follows allocations and frees ---
void pattern_meminfo() {
  const int before = g_failures.load();
  std::size_t free0 = 0, total = 0, free1 = 0, free2 = 0;
  CK(cudaMemGetInfo(&free0, &total));
  void* p = nullptr;
  if (CK(cudaMalloc(&p, GiB))) {
    CK(cudaMemGetInfo(&free1, &total));
    if (free1 + GiB - GiB / 100 > free0)
      fail("cudaMemGetInfo: free went from %zu to %zu after a 1 GiB allocation", free0, free1);
    CK(cudaFree(p));
  }
  CK(cudaMemGetInfo(&free2, &total));
  if (free2 + 64 * MiB < free0)
    fail("cudaMemGetInfo: free is %zu after freeing everything, was %zu", free2, free0);
  if (free0 > total || free2 > total) fail("cudaMemGetInfo: free above total %zu", total);
  report("meminfo", before, "free %.2f GiB -> %.2f with 1 GiB live -> %.2f after free, total %.2f GiB",
         free0 / double(GiB), free1 / double(GiB), free2 / double(GiB), total / double(GiB));
}

// --- out of memory on purpose, then allocate again ---
void pattern_oom() {
  const int before = g_failures.load();
  if (examples::sanitizer_safe()) {  // every failing call here is on purpose
    report("oom", before, "skipped (--sanitizer-safe: its allocations fail on purpose)");
    return;
  }
  std::size_t free0 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, total + GiB);
  if (e != cudaErrorMemoryAllocation) fail("cudaMalloc(total + 1 GiB) returned %s", cudaGetErrorName(e));
  cudaGetLastError();
  e = cudaMallocAsync(&p, total + GiB, 0);
  if (e != cudaErrorMemoryAllocation) fail("cudaMallocAsync(total + 1 GiB) returned %s", cudaGetErrorName(e));
  cudaGetLastError();
  // Fill the device in 1 GiB pieces until it says no, free them all, then ask
  // for one piece half as large as everything held: a cache must give its
  // cached segments back to the driver to serve it.
  std::vector<void*> chunks;
  const std::size_t max_chunks = total / GiB + 2;
  while (chunks.size() < max_chunks) {
    void* c = nullptr;
    e = cudaMalloc(&c, GiB);
    if (e != cudaSuccess) break;
    chunks.push_back(c);
  }
  if (e != cudaErrorMemoryAllocation) fail("filling the device ended with %s", cudaGetErrorName(e));
  cudaGetLastError();
  MismatchTally tally;
  if (!chunks.empty()) {
    fill(chunks.back(), GiB, seed_for(chunks.back(), 700), 0);
    check(chunks.back(), GiB, seed_for(chunks.back(), 700), 0, tally.take());
  }
  for (void* c : chunks) CK(cudaFree(c));
  const std::size_t big = std::max<std::size_t>(chunks.size() / 2, 1) * GiB;
  void* b = nullptr;
  if (CK(cudaMalloc(&b, big))) {
    fill(b, big, seed_for(b, 701), 0);
    check(b, big, seed_for(b, 701), 0, tally.take());
    CK(cudaFree(b));
  }
  void* small = nullptr;
  if (CK(cudaMalloc(&small, MiB))) {
    fill(small, MiB, seed_for(small, 702), 0);
    check(small, MiB, seed_for(small, 702), 0, tally.take());
    CK(cudaFree(small));
  }
  CK(cudaDeviceSynchronize());
  if (tally.total()) fail("oom: %llu words differed from what was written", tally.total());
  std::size_t free1 = 0;
  CK(cudaMemGetInfo(&free1, &total));
  if (free1 + 256 * MiB < free0) fail("oom: free memory %zu after the test, %zu before", free1, free0);
  report("oom", before, "OOM returned as expected; held %zu GiB before the device said no, then "
         "%zu GiB in one piece; free %.2f GiB after", chunks.size(), big / GiB, free1 / double(GiB));
}

struct Pattern {
  const char* name;
  void (*run)();
};
const Pattern kPatterns[] = {{"sizes", pattern_sizes},     {"fence", pattern_fence},
                             {"async", pattern_async},     {"graph", pattern_graph},
                             {"threads", pattern_threads}, {"meminfo", pattern_meminfo}, {"fence_blocking", pattern_fence_blocking},
                             {"oom", pattern_oom}};

bool selected(const char* name, int argc, char** argv) {
  if (argc < 2) return true;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

}  // namespace

// alloc_patterns [--sanitizer-safe] [PATTERN...]: all patterns, or only those named.
int main(int argc, char** argv) {
  examples::take_sanitizer_safe_flag(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("alloc_patterns: SKIP (no usable GPU)\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("alloc_patterns: %s, cudart %d%s\n", prop.name, CUDART_VERSION,
              examples::sanitizer_safe() ? ", sanitizer-safe" : "");
  if (!g_counters.init()) return 1;
  for (const Pattern& p : kPatterns)
    if (selected(p.name, argc, argv)) p.run();
  const int failures = g_failures.load();
  if (failures == 0) {
    std::printf("alloc_patterns: PASS\n");
    return 0;
  }
  std::printf("alloc_patterns: FAIL (%d checks failed)\n", failures);
  return 1;
}
