// test_threads.cpp — one allocator shared by several threads (the shim's
// situation: every thread of the program allocates through the same
// context's allocator).  Checks that nothing is handed out twice and that
// the invariants and statistics hold afterwards.
#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "alloc_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

// The fake backend is not thread-safe by itself; the allocator calls it under
// its own lock, which is exactly what this test relies on.
void worker(CachingAllocator& alloc, int id, std::set<DevicePtr>& owned, std::mutex& owned_mutex,
            std::atomic<int>& errors) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(id) * 7919);
  std::vector<DevicePtr> mine;
  for (int i = 0; i < 4000; ++i) {
    if (mine.empty() || rng() % 2 == 0) {
      DevicePtr p = 0;
      const std::size_t size = 1 + rng() % (rng() % 4 == 0 ? 24 * MiB : 64 * KiB);
      if (alloc.malloc(&p, size, static_cast<StreamId>(id % 2)) != kSuccess) {
        ++errors;
        continue;
      }
      std::lock_guard lock(owned_mutex);
      if (!owned.insert(p).second) ++errors;  // handed out twice
      mine.push_back(p);
    } else {
      const std::size_t k = rng() % mine.size();
      {
        std::lock_guard lock(owned_mutex);
        owned.erase(mine[k]);
      }
      if (alloc.free(mine[k]) != kSuccess) ++errors;
      mine[k] = mine.back();
      mine.pop_back();
    }
  }
  for (DevicePtr p : mine) {
    {
      std::lock_guard lock(owned_mutex);
      owned.erase(p);
    }
    if (alloc.free(p) != kSuccess) ++errors;
  }
}

}  // namespace

TEST_CASE("four threads share one allocator without double hand-outs") {
  AllocFixture f(Config{}, 64 * GiB);
  std::set<DevicePtr> owned;
  std::mutex owned_mutex;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back(worker, std::ref(*f.alloc), t, std::ref(owned), std::ref(owned_mutex), std::ref(errors));
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);
  f.alloc->validate();
  const auto s = f.stats();
  CHECK(s.allocation[StatType::aggregate].current == 0);
  CHECK(s.allocation[StatType::aggregate].allocated == s.allocation[StatType::aggregate].freed);
  CHECK(s.allocation[StatType::aggregate].allocated > 4000);
  f.empty_cache();
  CHECK(f.backend.used() == 0);
}
