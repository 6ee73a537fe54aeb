// test_thread_counts.cpp — the per-thread call counts (shim/thread_counts.h)
// sum to exactly the calls made, by live threads, by threads that have
// exited and by new threads that took over an exited thread's block.
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

#include "../../shim/thread_counts.h"

using cachalloc::obs::Entry;
using cachalloc::shim::count_call;
using cachalloc::shim::total_calls;

namespace {

std::uint64_t total(Entry e) { return total_calls()[static_cast<int>(e)]; }

void count_n(Entry e, int n) {
  for (int i = 0; i < n; ++i) count_call(e);
}

}  // namespace

TEST_CASE("thread counts: exact totals over live, exited and reusing threads") {
  const std::uint64_t alloc0 = total(Entry::cuMemAlloc_v2), free0 = total(Entry::cuMemFree_v2);
  count_n(Entry::cuMemAlloc_v2, 3);  // this thread
  CHECK(total(Entry::cuMemAlloc_v2) == alloc0 + 3);

  // Eight threads at once, all exited before the sum.
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([] {
      count_n(Entry::cuMemAlloc_v2, 10'000);
      count_n(Entry::cuMemFree_v2, 7);
    });
  for (auto& t : ts) t.join();
  CHECK(total(Entry::cuMemAlloc_v2) == alloc0 + 3 + 80'000);
  CHECK(total(Entry::cuMemFree_v2) == free0 + 56);

  // Threads one after another take over the exited threads' blocks: the
  // counts already in a block stay in the totals.
  for (int round = 0; round < 20; ++round) std::thread([] { count_n(Entry::cuMemFree_v2, 5); }).join();
  CHECK(total(Entry::cuMemFree_v2) == free0 + 56 + 100);

  // A live thread's counts are in the sum while it runs.
  const std::uint64_t malloc0 = total(Entry::cudaMalloc);
  std::atomic<int> stage{0};
  std::thread live([&] {
    count_n(Entry::cudaMalloc, 42);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  });
  while (stage.load() != 1) std::this_thread::yield();
  CHECK(total(Entry::cudaMalloc) == malloc0 + 42);
  stage = 2;
  live.join();
  CHECK(total(Entry::cuMemAlloc_v2) == alloc0 + 3 + 80'000);  // nothing counted twice
}
