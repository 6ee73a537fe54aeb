// multi_stream.cu — several non-blocking streams allocating with plain
// cudaMalloc, writing and verifying their blocks with kernels, and freeing
// with plain cudaFree right after the last kernel is enqueued (issue 18,
// item 4): the program that measures, outside PyTorch, what an allocator
// costs in device memory and time when it does not know which streams use a
// block, and whether it keeps every word intact.
//
// N streams (cudaStreamNonBlocking, default 8), each with a few live blocks
// (default 4).  One iteration of a stream:
//   1. cudaMalloc a block of a pseudo-random size (log-uniform 4 KiB .. 64
//      MiB, a multiple of 4 bytes), from a generator of its own: the same
//      sizes in the same order on every run, whatever the threads'
//      interleaving, so a bare run and an LD_PRELOAD run do the same work;
//   2. fill it on the stream with a pattern seeded by (stream, iteration,
//      block serial) (verify_kernels.cuh);
//   3. once more than `live` blocks are held, enqueue the check of the
//      oldest (a kernel counting the words that differ) and cudaFree it at
//      once, with no synchronization: the check may still run when the
//      free returns.  The bare driver's cudaFree waits for the device; an
//      allocator that hands the block to another stream before the check
//      finished shows up as mismatching words.
// With --cross-every K, every K-th block is checked on the next stream
// instead (after an event wait), so a block freed with a plain cudaFree was
// last used on a stream other than the one it was allocated for.
//
// Modes: `threads` (default): one host thread per stream; `round-robin`: one
// thread drives every stream in turn.  Every `check_every` iterations a
// stream is synchronized and its mismatch counter read.
//
// Memory: a background thread samples the device's used memory every
// --sample-us (1000 µs) through NVML (libnvidia-ml.so.1, dlopen'ed; neither
// the driver's allocator nor cachalloc intercepts it) and keeps the
// maximum; peak = max - the value at start (after the context and the
// streams exist).  cudaMemGetInfo is deliberately not the main figure:
// under cachalloc it counts cached bytes that could be released as free
// (so total - free is not what the device holds), and each call flushes
// cachalloc's deferred fence, so sampling it every millisecond would change
// the behaviour being measured.  --meminfo samples it as well (the
// program's own view, `peak_meminfo_bytes`); without NVML it is the only
// source and the output says so.  A sampler can miss a peak shorter than
// its period: the bare driver's peaks are transient (freed memory goes back
// at once), cachalloc's are held, so sampling errs in the driver's favour.
//
// Output: the parameters, iterations, allocations, bytes allocated,
// mismatching words, wall time and peak, then one line
//   RESULT {"program":"multi_stream",...,"peak_bytes":N,"seconds":X,"mismatches":N,"allocs":N,...}
// for a harness comparing bare and LD_PRELOAD runs, then
// `multi_stream: PASS` (exit 0) or `multi_stream: FAIL ...` (exit 1: a word
// differed or a CUDA call failed).  Exit 77 when no GPU can be used, 2 on a
// bad option.
//
// Usage: multi_stream [--streams N] [--iters N] [--mode threads|round-robin]
//          [--live N] [--min-kib N] [--max-mib N] [--check-every N]
//          [--cross-every N] [--seed N] [--sample-us N] [--meminfo]
//          [--sanitizer-safe]
// --iters is per stream.  --sanitizer-safe (verify_kernels.cuh): each
// check is waited for before its cudaFree, so compute-sanitizer sees no
// kernel reading freed memory; the allocations are the same.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "example_checks.cuh"
#include "verify_kernels.cuh"

namespace {

constexpr std::size_t KiB = 1024, MiB = KiB * KiB;

using examples::fail;
using examples::g_failures;
using examples::ok;
#define CK_LAUNCH() ok(cudaGetLastError(), "kernel launch", __LINE__)

struct Options {
  int streams = 8;
  long iters = 12000;  // per stream; sized for ~10-20 s bare on an H100 (the driver's cudaMalloc+cudaFree ~80-130 µs)
  bool round_robin = false;
  int live = 4;
  std::size_t min_bytes = 4 * KiB;
  std::size_t max_bytes = 64 * MiB;
  long check_every = 64;
  long cross_every = 0;
  std::uint64_t seed = 1;
  long sample_us = 1000;
  bool meminfo = false;
};

// splitmix64: a stream's own generator, so its sizes do not depend on how
// the threads interleave.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

// Log-uniform in [lo, hi], a multiple of 4 bytes (the kernels check words).
std::size_t draw_size(Rng& rng, std::size_t lo, std::size_t hi) {
  const double l = std::log(static_cast<double>(lo)), h = std::log(static_cast<double>(hi));
  auto b = static_cast<std::size_t>(std::exp(l + (h - l) * rng.unit()));
  b = std::clamp(b, lo, hi) & ~static_cast<std::size_t>(3);
  return b ? b : 4;
}

// The pattern's seed for block `serial` of `stream` allocated at `iteration`.
std::uint32_t block_seed(int stream, long iteration, std::uint64_t serial) {
  std::uint64_t x = (static_cast<std::uint64_t>(stream) << 48) ^ (static_cast<std::uint64_t>(iteration) << 20) ^ serial;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<std::uint32_t>(x);
}

struct Block {
  void* p = nullptr;
  std::size_t bytes = 0;
  std::uint32_t seed = 0;
  std::uint64_t serial = 0;
};

struct StreamState {
  int index = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t handoff = nullptr;  // orders a check on the next stream after this one's fill
  unsigned long long* counter = nullptr;  // mapped pinned host memory (see main): kernels and host use this address
  Rng rng{0};
  std::deque<Block> live;
  std::uint64_t serial = 0;
  std::uint64_t allocs = 0, bytes = 0;
  unsigned long long seen = 0;  // mismatches read so far
};

const Options* g_opt = nullptr;
std::vector<StreamState>* g_streams = nullptr;
std::atomic<bool> g_stop{false};  // a CUDA call failed: every loop ends

void stop() { g_stop.store(true); }

// Reads the stream's counter after its work so far; reports new mismatches.
bool read_counter(StreamState& st, long iteration) {
  if (!CK(cudaStreamSynchronize(st.stream))) return false;
  const unsigned long long now = *static_cast<volatile unsigned long long*>(st.counter);
  if (now != st.seen) {
    fail("stream %d: %llu mismatching words by iteration %ld", st.index, now - st.seen, iteration);
    st.seen = now;
  }
  return true;
}

// Checks the block on the stream that will free it, or on the next stream
// after an event wait, then frees it at once.
bool retire(StreamState& st, const Block& b) {
  cudaStream_t where = st.stream;
  if (g_opt->cross_every > 0 && b.serial % static_cast<std::uint64_t>(g_opt->cross_every) == 0 && g_streams->size() > 1) {
    where = (*g_streams)[(st.index + 1) % g_streams->size()].stream;
    if (!CK(cudaEventRecord(st.handoff, st.stream)) || !CK(cudaStreamWaitEvent(where, st.handoff, 0))) return false;
  }
  examples::check(b.p, b.bytes, b.seed, where, st.counter);
  if (!CK_LAUNCH()) return false;
  if (examples::sanitizer_safe() && !CK(cudaStreamSynchronize(where))) return false;
  return CK(cudaFree(b.p));
}

// One iteration of one stream: allocate, fill, retire the oldest beyond `live`.
bool step(StreamState& st, long it) {
  Block b;
  b.bytes = draw_size(st.rng, g_opt->min_bytes, g_opt->max_bytes);
  b.serial = st.serial++;
  b.seed = block_seed(st.index, it, b.serial);
  if (!CK(cudaMalloc(&b.p, b.bytes))) return false;
  st.allocs++;
  st.bytes += b.bytes;
  examples::fill(b.p, b.bytes, b.seed, st.stream);
  if (!CK_LAUNCH()) return false;
  st.live.push_back(b);
  if (st.live.size() > static_cast<std::size_t>(g_opt->live)) {
    Block old = st.live.front();
    st.live.pop_front();
    if (!retire(st, old)) return false;
  }
  if ((it + 1) % g_opt->check_every == 0 && !read_counter(st, it)) return false;
  return true;
}

bool drain(StreamState& st, long it) {
  while (!st.live.empty()) {
    Block old = st.live.front();
    st.live.pop_front();
    if (!retire(st, old)) return false;
  }
  return read_counter(st, it);
}

// --- device memory sampling ------------------------------------------------------

// NVML through dlopen: no header or link dependency, absent library is fine.
struct Nvml {
  struct Memory {
    unsigned long long total, free, used;  // nvmlMemory_t (v1)
  };
  void* lib = nullptr;
  void* device = nullptr;
  int (*get_memory)(void*, Memory*) = nullptr;

  bool open(int cuda_device) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto by_index = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    get_memory = reinterpret_cast<int (*)(void*, Memory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    if (init == nullptr || get_memory == nullptr || init() != 0) return false;
    // CUDA's ordinal and NVML's index differ under CUDA_VISIBLE_DEVICES:
    // the PCI bus id names the same device for both.
    char bus[64] = {};
    if (by_bus != nullptr && cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) == cudaSuccess &&
        by_bus(bus, &device) == 0)
      return true;
    return by_index != nullptr && by_index(static_cast<unsigned>(cuda_device), &device) == 0;
  }
  bool used(unsigned long long* out) const {
    Memory m{};
    if (get_memory(device, &m) != 0) return false;
    *out = m.used;
    return true;
  }
};

struct Sampler {
  Nvml nvml;
  bool have_nvml = false, meminfo = false;
  unsigned long long base_nvml = 0, peak_nvml = 0;
  unsigned long long base_info = 0, peak_info = 0;
  std::uint64_t samples = 0;
  std::atomic<bool> done{false};
  std::thread thread;

  static bool info_used(unsigned long long* out) {
    std::size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return false;
    *out = t - f;
    return true;
  }
  void sample() {
    unsigned long long v = 0;
    if (have_nvml && nvml.used(&v)) peak_nvml = std::max(peak_nvml, v);
    if (meminfo && info_used(&v)) peak_info = std::max(peak_info, v);
    samples++;
  }
  void start(int device, bool want_meminfo, long period_us) {
    have_nvml = nvml.open(device);
    meminfo = want_meminfo || !have_nvml;
    if (have_nvml) nvml.used(&base_nvml);
    if (meminfo) info_used(&base_info);
    peak_nvml = base_nvml;
    peak_info = base_info;
    thread = std::thread([this, device, period_us] {
      cudaSetDevice(device);
      while (!done.load(std::memory_order_relaxed)) {
        sample();
        std::this_thread::sleep_for(std::chrono::microseconds(period_us));
      }
      sample();
    });
  }
  void finish() {
    done.store(true);
    thread.join();
  }
  unsigned long long peak() const { return have_nvml ? peak_nvml - base_nvml : peak_info - base_info; }
};

// --- options ---------------------------------------------------------------------

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "multi_stream: %s\n"
               "usage: multi_stream [--streams N] [--iters N] [--mode threads|round-robin] [--live N]\n"
               "                    [--min-kib N] [--max-mib N] [--check-every N] [--cross-every N]\n"
               "                    [--seed N] [--sample-us N] [--meminfo] [--sanitizer-safe]\n",
               why);
  std::exit(2);
}

// "--name value" or "--name=value"; a positive integer.
long long number(int argc, char** argv, int& i, const char* name) {
  const std::size_t n = std::strlen(name);
  const char* text = nullptr;
  if (argv[i][n] == '=') {
    text = argv[i] + n + 1;
  } else {
    if (i + 1 >= argc) usage((std::string(name) + " needs a value").c_str());
    text = argv[++i];
  }
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 0) usage((std::string(name) + ": not a number >= 0: " + text).c_str());
  return v;
}

bool is(const char* arg, const char* name) {
  const std::size_t n = std::strlen(name);
  return std::strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (is(a, "--streams")) o.streams = static_cast<int>(number(argc, argv, i, "--streams"));
    else if (is(a, "--iters")) o.iters = static_cast<long>(number(argc, argv, i, "--iters"));
    else if (is(a, "--live")) o.live = static_cast<int>(number(argc, argv, i, "--live"));
    else if (is(a, "--min-kib")) o.min_bytes = number(argc, argv, i, "--min-kib") * KiB;
    else if (is(a, "--max-mib")) o.max_bytes = number(argc, argv, i, "--max-mib") * MiB;
    else if (is(a, "--check-every")) o.check_every = static_cast<long>(number(argc, argv, i, "--check-every"));
    else if (is(a, "--cross-every")) o.cross_every = static_cast<long>(number(argc, argv, i, "--cross-every"));
    else if (is(a, "--seed")) o.seed = static_cast<std::uint64_t>(number(argc, argv, i, "--seed"));
    else if (is(a, "--sample-us")) o.sample_us = static_cast<long>(number(argc, argv, i, "--sample-us"));
    else if (std::strcmp(a, "--meminfo") == 0) o.meminfo = true;
    else if (is(a, "--mode")) {
      std::string m = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : "");
      if (m == "threads") o.round_robin = false;
      else if (m == "round-robin") o.round_robin = true;
      else usage("--mode is threads or round-robin");
    } else {
      usage((std::string("unknown argument ") + a).c_str());
    }
  }
  if (o.streams < 1 || o.streams > 1024) usage("--streams: 1 .. 1024");
  if (o.live < 1) usage("--live: at least 1");
  if (o.check_every < 1) usage("--check-every: at least 1");
  if (o.sample_us < 1) usage("--sample-us: at least 1");
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes) usage("sizes: 4 bytes <= --min-kib <= --max-mib");
  return o;
}

double mib(unsigned long long b) { return static_cast<double>(b) / MiB; }

}  // namespace

int main(int argc, char** argv) {
  examples::take_sanitizer_safe_flag(argc, argv);
  const Options opt = parse(argc, argv);
  g_opt = &opt;
  examples::g_max_printed = 20;  // a broken allocator fails every check: the first few say enough

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("multi_stream: SKIP (no GPU)\n");
    return 77;
  }
  const int device = 0;
  if (!CK(cudaSetDevice(device)) || !CK(cudaFree(nullptr))) {  // the context, before the baseline
    std::printf("multi_stream: FAIL (no context)\n");
    return 1;
  }

  // Mismatch counters live in mapped pinned host memory, one cache line per
  // stream: the allocator under test never serves them, so a wrong block
  // cannot overwrite the count that would report it.
  unsigned long long* counters = nullptr;
  constexpr int kStride = 8;  // 64 bytes
  if (!CK(cudaHostAlloc(reinterpret_cast<void**>(&counters), sizeof(unsigned long long) * kStride * opt.streams,
                        cudaHostAllocMapped))) {
    std::printf("multi_stream: FAIL (no pinned counters)\n");
    return 1;
  }
  std::memset(counters, 0, sizeof(unsigned long long) * kStride * opt.streams);

  std::vector<StreamState> streams(opt.streams);
  g_streams = &streams;
  bool setup_ok = true;
  for (int i = 0; i < opt.streams; ++i) {
    StreamState& st = streams[i];
    st.index = i;
    st.rng.s = opt.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) * 0xC2B2AE3D27D4EB4Full;
    st.counter = counters + kStride * i;  // unified addressing: the same address on the device
    setup_ok = setup_ok && CK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking)) &&
               CK(cudaEventCreateWithFlags(&st.handoff, cudaEventDisableTiming));
  }
  if (!setup_ok) {
    std::printf("multi_stream: FAIL (setup)\n");
    return 1;
  }
  std::printf("multi_stream: mode %s, %d non-blocking streams, %ld iterations each, %d live blocks per stream, "
              "sizes %zu KiB .. %zu MiB, counters read every %ld iterations%s%s\n",
              opt.round_robin ? "round-robin (one thread)" : "threads (one per stream)", opt.streams, opt.iters,
              opt.live, opt.min_bytes / KiB, opt.max_bytes / MiB, opt.check_every,
              opt.cross_every > 0 ? (", every " + std::to_string(opt.cross_every) + "th block checked on the next stream").c_str() : "",
              examples::sanitizer_safe() ? ", sanitizer-safe" : "");
  std::fflush(stdout);

  Sampler sampler;
  sampler.start(device, opt.meminfo, opt.sample_us);
  const auto t0 = std::chrono::steady_clock::now();

  auto run_stream = [&](StreamState& st) {
    for (long it = 0; it < opt.iters && !g_stop.load(std::memory_order_relaxed); ++it)
      if (!step(st, it)) {
        stop();
        return;
      }
  };
  if (opt.round_robin) {
    for (long it = 0; it < opt.iters && !g_stop.load(); ++it)
      for (StreamState& st : streams)
        if (!step(st, it)) {
          stop();
          break;
        }
  } else {
    std::vector<std::thread> threads;
    for (StreamState& st : streams)
      threads.emplace_back([&, p = &st] {
        if (!CK(cudaSetDevice(device))) {
          stop();
          return;
        }
        run_stream(*p);
      });
    for (auto& t : threads) t.join();
  }
  for (StreamState& st : streams)
    if (!drain(st, opt.iters)) stop();
  CK(cudaDeviceSynchronize());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sampler.finish();

  unsigned long long mismatches = 0;
  std::uint64_t allocs = 0, bytes = 0;
  for (int i = 0; i < opt.streams; ++i) {
    mismatches += *static_cast<volatile unsigned long long*>(streams[i].counter);
    allocs += streams[i].allocs;
    bytes += streams[i].bytes;
  }
  const long iterations = static_cast<long>(allocs);  // one allocation per stream iteration
  for (StreamState& st : streams) {
    CK(cudaEventDestroy(st.handoff));
    CK(cudaStreamDestroy(st.stream));
  }
  CK(cudaFreeHost(counters));

  const unsigned long long peak = sampler.peak();
  const char* source = sampler.have_nvml ? "nvml" : "mem_get_info";
  std::printf("  iterations: %ld (%ld per stream x %d streams), allocations %" PRIu64 ", bytes allocated %.1f GiB\n",
              iterations, opt.iters, opt.streams, allocs, static_cast<double>(bytes) / (1024.0 * MiB));
  std::printf("  mismatching words: %llu\n", mismatches);
  std::printf("  wall time: %.3f s (%.1f us per allocation)\n", seconds, allocs ? seconds * 1e6 / allocs : 0.0);
  std::printf("  peak device memory used (%s, max - start, %" PRIu64 " samples every %ld us): %.1f MiB\n",
              sampler.have_nvml ? "NVML" : "cudaMemGetInfo total - free", sampler.samples, opt.sample_us, mib(peak));
  if (sampler.have_nvml && sampler.meminfo)
    std::printf("  peak as cudaMemGetInfo says (total - free, max - start): %.1f MiB\n",
                mib(sampler.peak_info - sampler.base_info));
  std::printf("RESULT {\"program\":\"multi_stream\",\"mode\":\"%s\",\"streams\":%d,\"iterations\":%ld,"
              "\"allocs\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"mismatches\":%llu,\"seconds\":%.6f,"
              "\"peak_bytes\":%llu,\"peak_source\":\"%s\",\"peak_meminfo_bytes\":%s,\"samples\":%" PRIu64
              ",\"failures\":%d}\n",
              opt.round_robin ? "round-robin" : "threads", opt.streams, iterations, allocs, bytes, mismatches, seconds,
              peak, source,
              sampler.meminfo ? std::to_string(sampler.peak_info - sampler.base_info).c_str() : "null",
              sampler.samples, g_failures.load());
  const bool pass = mismatches == 0 && g_failures.load() == 0 && !g_stop.load();
  if (pass) {
    std::printf("multi_stream: PASS\n");
    return 0;
  }
  std::printf("multi_stream: FAIL (%llu mismatching words, %d failed checks or CUDA calls)\n", mismatches,
              g_failures.load());
  return 1;
}
