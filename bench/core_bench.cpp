// core_bench.cpp — the caching core alone on the fake backend, one thread.
//
// Measures what the core adds to every call, without a driver: ns per
// malloc+free pair of one size (the block is cached after the first pair),
// and ns per operation for a churn of 1000 live blocks of random sizes
// (512 B – 32 MiB, log-uniform), each step freeing a random live block and
// allocating a new one.  Prints a Markdown table; medians of several runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "process_observer.h"

using namespace cachalloc;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double pair_ns(std::size_t size, int iters, AllocatorObserver* observer = nullptr) {
  testing::FakeBackend backend;
  CachingAllocator alloc(&backend, Config{});
  alloc.set_observer(observer);
  DevicePtr p = 0;
  alloc.malloc(&p, size, 0);  // warm: the segment is now cached
  alloc.free(p);
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    alloc.malloc(&p, size, 0);
    alloc.free(p);
  }
  const auto t1 = Clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}

double churn_ns_per_op(int live_blocks, int steps, std::uint64_t seed) {
  testing::FakeBackend backend(1024 * GiB);
  CachingAllocator alloc(&backend, Config{});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(32.0 * MiB));
  auto random_size = [&] { return static_cast<std::size_t>(std::exp(log_size(rng))); };
  std::vector<DevicePtr> live(static_cast<std::size_t>(live_blocks));
  for (auto& p : live) alloc.malloc(&p, random_size(), 0);
  // Pre-draw the sequence so the RNG is not timed.
  std::vector<std::pair<std::size_t, std::size_t>> plan(static_cast<std::size_t>(steps));
  for (auto& [slot, size] : plan) {
    slot = rng() % live.size();
    size = random_size();
  }
  const auto t0 = Clock::now();
  for (const auto& [slot, size] : plan) {
    alloc.free(live[slot]);
    alloc.malloc(&live[slot], size, 0);
  }
  const auto t1 = Clock::now();
  for (DevicePtr p : live) alloc.free(p);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (2.0 * steps);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 7;
  std::printf("| case | ns (median of %d runs) |\n|---|---|\n", runs);
  for (std::size_t size : {std::size_t{512}, 1 * MiB, 64 * MiB}) {
    std::vector<double> v;
    for (int r = 0; r < runs; ++r) v.push_back(pair_ns(size, 200000));
    std::printf("| malloc+free pair, %zu B | %.1f |\n", size, median(v));
  }
  std::vector<double> v;
  for (int r = 0; r < runs; ++r) v.push_back(churn_ns_per_op(1000, 200000, 42 + static_cast<std::uint64_t>(r)));
  std::printf("| churn, 1000 live blocks 512 B-32 MiB, per op | %.1f |\n", median(v));

  // The observability observer: installed with tracing off (the default
  // under the shim), then with the trace ring on (two events per pair).
  auto& observer = obs::ProcessObserver::instance();
  for (const char* trace : {"", "/dev/null"}) {
    Config cfg;
    cfg.trace = trace;
    observer.configure(cfg);
    std::vector<double> t;
    for (int r = 0; r < runs; ++r) t.push_back(pair_ns(512, 200000, &observer));
    std::printf("| malloc+free pair, 512 B, observer installed, trace %s | %.1f |\n", *trace ? "on" : "off",
                median(t));
  }
  return 0;
}
