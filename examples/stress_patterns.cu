// stress_patterns.cu — many host threads allocating, using and freeing device
// memory at once for a fixed time, with every block's contents checked by
// kernels.  Built like alloc_patterns (static and shared cudart) and run
// with and without libcachalloc.so preloaded, and under compute-sanitizer:
// the program only does what CUDA allows, so it must pass every way.
//
// Each thread owns streams (some blocking, some non-blocking; replaced now
// and then: cudaStreamSynchronize, cudaStreamDestroy, cudaStreamCreate) and
// a set of live blocks.  A block gets random size (256 B .. 24 MiB) from
// cudaMalloc or cudaMallocAsync (on an own stream, a stream shared by all
// threads, the legacy or the per-thread default stream), and a fill kernel
// writes a pattern made from its owner (thread) and serial number over the
// whole block.  Before every free a check kernel counts the words that
// differ into mapped pinned host memory; frees go through cudaFreeAsync on
// the block's stream, cudaFreeAsync on another stream after an event wait
// (cudaMallocAsync memory), or cudaFree (cudaMalloc memory, or async memory
// whose work is done).  Blocks also move between threads (an event orders the
// receiver after the giver's work), and a "late reader" probe frees a block
// while a kernel still spins before reading it, then allocates and writes
// new blocks of the same size at once.  Two live blocks overlapping, or
// memory handed out again before the work that used it finished, shows as
// mismatches.
//
// Usage: stress_patterns [--sanitizer-safe] [seconds]   (default 20)
// --sanitizer-safe (verify_kernels.cuh; tests/gpu/run_sanitizer.sh): a
// cudaMalloc block's last kernel is waited for before its cudaFree, the
// late reader's included, so that compute-sanitizer never sees a kernel
// reading memory the host has freed; everything else is the same.
// Prints `stress_patterns: PASS` and exits 0 when no word differed and no
// CUDA call failed; `stress_patterns: FAIL ...` and 1 otherwise; 77 when no
// GPU can be used.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "example_checks.cuh"
#include "verify_kernels.cuh"

namespace {

constexpr std::size_t KiB = 1024, MiB = KiB * KiB;
constexpr int kThreads = 8;
constexpr int kOwnStreams = 2;
constexpr int kSharedStreams = 2;
constexpr std::size_t kMaxLive = 12;
constexpr std::size_t kMailboxMax = 32;
constexpr std::uint64_t kLateReaderNs = 300'000;  // the probe's kernel spins 0.3 ms before reading

using examples::fail;
using examples::g_failures;
using examples::ok;
// After kernel launches: launch errors are reported here.
#define CK_LAUNCH() ok(cudaGetLastError(), "kernel launch", __LINE__)

// Mismatch counters: mapped pinned host memory, so reading them does not
// depend on the allocator under test.  One per thread (kernels add to it).
unsigned long long* g_mismatches = nullptr;

cudaStream_t g_shared[kSharedStreams];

struct Block {
  void* p = nullptr;
  std::size_t bytes = 0;
  std::uint32_t seed = 0;
  int owner = 0;
  cudaStream_t last = nullptr;  // where its last kernel ran
  bool own_stream = false;      // `last` is one of its holder's own streams
  bool async = false;           // from cudaMallocAsync
};

// Blocks handed between threads; `ready` orders the receiver after the
// giver's last kernel on the block.
struct Handover {
  Block block;
  cudaEvent_t ready;
};
std::mutex g_mailbox_mutex;
std::deque<Handover> g_mailbox;

std::uint32_t seed_of(int owner, std::uint64_t serial) {
  std::uint64_t x = (static_cast<std::uint64_t>(owner) << 48) ^ (serial * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<std::uint32_t>(x);
}

struct Tally {
  unsigned long allocs = 0, frees = 0, checks = 0, handed = 0, received = 0, stream_swaps = 0, probes = 0,
                reused_at_once = 0;
};

class Worker {
 public:
  Worker(int id, std::chrono::steady_clock::time_point deadline)
      : id_(id), rng_(1234u + static_cast<unsigned>(id)), deadline_(deadline) {}

  void run() {
    if (!CK(cudaSetDevice(0))) return;
    counter_ = &g_mismatches[id_];
    for (int i = 0; i < kOwnStreams; ++i) make_stream(i);
    while (std::chrono::steady_clock::now() < deadline_ && g_failures.load() == 0) step();
    for (Block& b : live_) release(b);
    live_.clear();
    for (cudaStream_t s : own_) CK(cudaStreamDestroy(s));
  }

  Tally tally() const { return tally_; }

 private:
  unsigned pick(unsigned n) { return std::uniform_int_distribution<unsigned>(0, n - 1)(rng_); }
  bool chance(unsigned percent) { return pick(100) < percent; }

  std::size_t random_size() {
    const unsigned r = pick(100);
    if (r < 50) return 256 + pick(64 * KiB);
    if (r < 85) return 64 * KiB + pick(2 * MiB);
    if (r < 98) return 2 * MiB + pick(8 * MiB);
    return 10 * MiB + pick(14 * MiB);
  }

  void make_stream(int i) {
    CK(cudaStreamCreateWithFlags(&own_[i], chance(40) ? cudaStreamNonBlocking : cudaStreamDefault));
  }

  bool is_own(cudaStream_t s) const { return std::find(std::begin(own_), std::end(own_), s) != std::end(own_); }

  // A stream this thread may use now: its own, a shared one, the legacy or
  // its per-thread default stream.
  cudaStream_t any_stream() {
    switch (pick(5)) {
      case 0: return own_[0];
      case 1: return own_[1];
      case 2: return g_shared[pick(kSharedStreams)];
      case 3: return cudaStreamLegacy;
      default: return cudaStreamPerThread;
    }
  }

  // Orders `to` after the work enqueued so far on `from`.
  void order(cudaStream_t from, cudaStream_t to) {
    if (from == to) return;
    cudaEvent_t e;
    if (!CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming))) return;
    CK(cudaEventRecord(e, from));
    CK(cudaStreamWaitEvent(to, e, 0));
    CK(cudaEventDestroy(e));
  }

  void fill(Block& b, cudaStream_t s) {
    order(b.last, s);
    examples::fill(b.p, b.bytes, b.seed, s);
    CK_LAUNCH();
    b.last = s;
    b.own_stream = is_own(s);
  }

  void check(Block& b) {
    examples::check(b.p, b.bytes, b.seed, b.last, counter_);
    CK_LAUNCH();
    ++tally_.checks;
  }

  void allocate() {
    Block b;
    b.bytes = random_size();
    b.owner = id_;
    b.seed = seed_of(id_, ++serial_);
    cudaStream_t s = any_stream();
    b.async = !chance(40);
    if (!CK(b.async ? cudaMallocAsync(&b.p, b.bytes, s) : cudaMalloc(&b.p, b.bytes))) return;
    b.last = s;  // cudaMalloc memory is ready for any stream; async memory for `s`
    fill(b, s);
    ++tally_.allocs;
    live_.push_back(b);
  }

  // Checks `b`, then frees it in one of the ways CUDA allows.  cudaMalloc
  // memory goes to cudaFree, which synchronizes with the device first (what
  // alloc_patterns' fence pattern measures).  cudaMallocAsync memory: on its
  // stream, on another stream ordered after it, or cudaFree once its work is
  // done (cudaFree does not wait for stream-ordered memory).
  void release(Block& b) {
    check(b);
    if (!b.async) {
      if (examples::sanitizer_safe()) CK(cudaStreamSynchronize(b.last));
      CK(cudaFree(b.p));
    } else {
      switch (pick(3)) {
        case 0: CK(cudaFreeAsync(b.p, b.last)); break;
        case 1: {
          cudaStream_t t = any_stream();
          order(b.last, t);
          CK(cudaFreeAsync(b.p, t));
          break;
        }
        default:
          CK(cudaStreamSynchronize(b.last));
          CK(cudaFree(b.p));
          break;
      }
    }
    ++tally_.frees;
  }

  void free_random() {
    if (live_.empty()) return;
    const std::size_t i = pick(static_cast<unsigned>(live_.size()));
    Block b = live_[i];
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!b.own_stream && chance(20)) {  // hand it over (its stream outlives this thread's swaps)
      Handover h{b, nullptr};
      if (CK(cudaEventCreateWithFlags(&h.ready, cudaEventDisableTiming)) && CK(cudaEventRecord(h.ready, b.last))) {
        std::lock_guard lock(g_mailbox_mutex);
        if (g_mailbox.size() < kMailboxMax) {
          g_mailbox.push_back(h);
          ++tally_.handed;
          return;
        }
      }
      if (h.ready) CK(cudaEventDestroy(h.ready));
    }
    release(b);
  }

  void receive() {
    Handover h;
    {
      std::lock_guard lock(g_mailbox_mutex);
      if (g_mailbox.empty()) return;
      h = g_mailbox.front();
      g_mailbox.pop_front();
    }
    cudaStream_t s = any_stream();
    CK(cudaStreamWaitEvent(s, h.ready, 0));
    CK(cudaEventDestroy(h.ready));
    Block b = h.block;
    b.last = s;
    b.own_stream = is_own(s);
    check(b);  // still the giver's pattern
    ++tally_.received;
    if (live_.size() < kMaxLive && chance(60)) {  // adopt: write this thread's pattern
      b.owner = id_;
      b.seed = seed_of(id_, ++serial_);
      fill(b, s);
      live_.push_back(b);
    } else {
      release(b);
    }
  }

  // Replaces own stream i; its blocks move to the new stream once its work is done.
  void swap_stream() {
    const int i = static_cast<int>(pick(kOwnStreams));
    cudaStream_t old = own_[i];
    CK(cudaStreamSynchronize(old));
    CK(cudaStreamDestroy(old));
    make_stream(i);
    for (Block& b : live_)
      if (b.last == old) b.last = own_[i];
    ++tally_.stream_swaps;
  }

  // A kernel still reads x (after spinning) when the host frees it; new
  // blocks of the same size are allocated and written at once on another
  // stream.  If x's memory came back before the reader finished, the reader
  // counts mismatches.
  void late_reader() {
    Block x;
    x.bytes = random_size() % (4 * MiB) + 4 * KiB;
    x.owner = id_;
    x.seed = seed_of(id_, ++serial_);
    cudaStream_t r = own_[0];
    x.async = chance(50);
    if (!CK(x.async ? cudaMallocAsync(&x.p, x.bytes, r) : cudaMalloc(&x.p, x.bytes))) return;
    x.last = r;
    fill(x, r);
    examples::spin_then_check_kernel<<<4, 256, 0, r>>>(static_cast<const std::uint32_t*>(x.p), x.bytes / 4, x.seed,
                                                        kLateReaderNs, counter_);
    CK_LAUNCH();
    if (x.async) {
      CK(cudaFreeAsync(x.p, r));  // stream-ordered after the reader
    } else {
      if (examples::sanitizer_safe()) CK(cudaStreamSynchronize(r));  // the reader is done first
      CK(cudaFree(x.p));  // synchronizes with the device first
    }
    ++tally_.frees;
    cudaStream_t w = own_[1];
    for (int k = 0; k < 2 && live_.size() < kMaxLive; ++k) {
      Block y;
      y.bytes = x.bytes;
      y.owner = id_;
      y.seed = seed_of(id_, ++serial_);
      y.async = chance(50);
      if (!CK(y.async ? cudaMallocAsync(&y.p, y.bytes, w) : cudaMalloc(&y.p, y.bytes))) break;
      if (y.p == x.p) ++tally_.reused_at_once;
      y.last = w;
      fill(y, w);
      ++tally_.allocs;
      live_.push_back(y);
    }
    ++tally_.probes;
  }

  void step() {
    const unsigned r = pick(100);
    if (r < 35) {
      if (live_.size() < kMaxLive) allocate();
      else free_random();
    } else if (r < 70) {
      free_random();
    } else if (r < 80) {
      if (!live_.empty()) check(live_[pick(static_cast<unsigned>(live_.size()))]);
    } else if (r < 90) {
      receive();
    } else if (r < 93) {
      swap_stream();
    } else if (r < 96) {
      late_reader();
    } else if (!live_.empty()) {  // rewrite a live block on another stream
      Block& b = live_[pick(static_cast<unsigned>(live_.size()))];
      b.seed = seed_of(id_, ++serial_);
      fill(b, any_stream());
    }
  }

  int id_;
  std::mt19937 rng_;
  std::chrono::steady_clock::time_point deadline_;
  unsigned long long* counter_ = nullptr;
  std::uint64_t serial_ = 0;
  std::vector<Block> live_;
  cudaStream_t own_[kOwnStreams] = {};
  Tally tally_;
};

}  // namespace

int main(int argc, char** argv) {
  examples::g_max_printed = 20;  // a stress loop fails in bulk: the first ones say enough
  examples::take_sanitizer_safe_flag(argc, argv);
  const double seconds = argc > 1 ? std::atof(argv[1]) : 20.0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("stress_patterns: SKIP (no usable GPU)\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("stress_patterns: %s, cudart %d, %d threads for %.1f s%s\n", prop.name, CUDART_VERSION, kThreads, seconds,
              examples::sanitizer_safe() ? ", sanitizer-safe" : "");
  std::fflush(stdout);
  if (!CK(cudaHostAlloc(&g_mismatches, kThreads * sizeof(*g_mismatches), cudaHostAllocMapped))) return 1;
  std::fill(g_mismatches, g_mismatches + kThreads, 0ull);
  for (cudaStream_t& s : g_shared) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<long long>(seconds * 1e6));
  std::vector<Worker> workers;
  workers.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) workers.emplace_back(i, deadline);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back([&workers, i] { workers[static_cast<std::size_t>(i)].run(); });
  for (std::thread& t : threads) t.join();

  // Blocks still waiting in the mailbox: check and free them here.
  for (Handover& h : g_mailbox) {
    CK(cudaStreamWaitEvent(g_shared[0], h.ready, 0));
    CK(cudaEventDestroy(h.ready));
    examples::check(h.block.p, h.block.bytes, h.block.seed, g_shared[0], &g_mismatches[h.block.owner]);
    CK_LAUNCH();
    if (h.block.async) {
      CK(cudaFreeAsync(h.block.p, g_shared[0]));
    } else {
      CK(cudaStreamSynchronize(g_shared[0]));
      CK(cudaFree(h.block.p));
    }
  }
  g_mailbox.clear();
  CK(cudaDeviceSynchronize());
  for (cudaStream_t s : g_shared) CK(cudaStreamDestroy(s));

  Tally total;
  for (const Worker& w : workers) {
    const Tally t = w.tally();
    total.allocs += t.allocs;
    total.frees += t.frees;
    total.checks += t.checks;
    total.handed += t.handed;
    total.received += t.received;
    total.stream_swaps += t.stream_swaps;
    total.probes += t.probes;
    total.reused_at_once += t.reused_at_once;
  }
  unsigned long long mismatches = 0;
  for (int i = 0; i < kThreads; ++i) {
    if (g_mismatches[i]) fail("thread %d: %llu words differed from what was written", i, g_mismatches[i]);
    mismatches += g_mismatches[i];
  }
  CK(cudaFreeHost(g_mismatches));
  std::printf("  %lu allocations, %lu frees, %lu check kernels, %lu blocks handed between threads (%lu received), "
              "%lu stream swaps, %lu late-reader probes (address reused at once %lu times); %llu words differed\n",
              total.allocs, total.frees, total.checks, total.handed, total.received, total.stream_swaps, total.probes,
              total.reused_at_once, mismatches);
  const int failures = g_failures.load();
  if (failures == 0) {
    std::printf("stress_patterns: PASS\n");
    return 0;
  }
  std::printf("stress_patterns: FAIL (%d checks failed)\n", failures);
  return 1;
}
