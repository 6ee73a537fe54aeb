// test_randomized.cpp — long random sequences of malloc / free / record_stream
// / free_fenced / free_deferred / empty_cache with injected device failures,
// events that complete at random and fences over non-blocking streams that
// are busy at random, checking after every step the invariants, the
// statistics against a model kept by the test itself, the fence statistics
// against the fake backend's counts, and every address handed out against
// the ranges not yet safe to reuse (reuse_oracle.h).
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "alloc_fixture.h"
#include "reuse_oracle.h"
#include "size_policy.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

struct Live {
  std::size_t size;
  std::size_t rounded;
  StreamId stream;
  std::vector<StreamId> uses;  // record_stream
};

// Streams 0x22 and 0x33 are non-blocking: fences query them, and record an
// event on them while they are busy.
constexpr StreamId kStreams[] = {0, 0x11, 0x22, 0x33};
constexpr StreamId kNonBlocking[] = {0x22, 0x33};

std::size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return 1 + rng() % 4096;              // tiny
    case 1: return 1 + rng() % (1 * MiB);         // small pool
    case 2: return 1 * MiB + rng() % (12 * MiB);  // 20 MiB segments
    default: return 1 + rng() % (96 * MiB);       // anything
  }
}

// The final statistics and how many addresses came back after a wait, so
// that callers can check the paths were exercised.
struct Outcome {
  DeviceStats stats;
  std::size_t waited_reuses;
};

Outcome run_random(std::uint64_t seed, int steps, const Config& cfg, std::size_t device_bytes,
                   bool joins = false) {
  AllocFixture f(cfg, device_bytes);
  f.backend.allow_joins(joins);
  ReuseOracle oracle(f.backend);
  for (StreamId s : kNonBlocking) f.backend.add_nonblocking_stream(s);
  std::mt19937_64 rng(seed);
  std::map<DevicePtr, Live> live;
  std::int64_t expected_ooms = 0;
  for (int step = 0; step < steps; ++step) {
    INFO("seed " << seed << " step " << step);
    const unsigned op = rng() % 100;
    if (op < 45 || live.empty()) {
      if (rng() % 20 == 0) f.backend.fail_next_allocs(1 + static_cast<int>(rng() % 3));
      const std::size_t size = random_size(rng);
      const StreamId s = kStreams[rng() % 4];
      DevicePtr p = 0;
      const Status st = f.try_malloc(size, s, &p);
      if (st == kOutOfMemory) {
        ++expected_ooms;
        continue;
      }
      REQUIRE(st == kSuccess);
      REQUIRE(live.count(p) == 0);
      const std::string early = oracle.check(p, size, s);
      INFO(early);
      REQUIRE(early.empty());
      live[p] = {size, round_size(size, cfg), s, {}};
    } else if (op < 80) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const Live& l = it->second;
      const unsigned how = rng() % 4;
      if (how == 0) {
        const StreamId s = kStreams[rng() % 4];
        REQUIRE(f.alloc->record_stream(it->first, s) == kSuccess);
        f.alloc->validate();
        it->second.uses.push_back(s);
      } else if (how == 1) {
        oracle.freeing(it->first, l.size, l.stream, l.uses, kStreams);
        REQUIRE(f.alloc->free_fenced(it->first, kStreams) == kSuccess);
        f.alloc->validate();
        live.erase(it);
      } else if (how == 2) {
        oracle.freeing_deferred(it->first, l.size, l.stream);
        REQUIRE(f.alloc->free_deferred(it->first) == kSuccess);
        f.alloc->validate();
        live.erase(it);
      } else {
        oracle.freeing(it->first, l.size, l.stream, l.uses);
        f.free(it->first);
        live.erase(it);
      }
    } else if (op < 92) {
      f.backend.complete_events_on(kStreams[rng() % 4]);
      if (rng() % 2 == 0) f.backend.set_stream_busy(kNonBlocking[rng() % 2], rng() % 2 == 0);
    } else if (op < 95) {
      f.empty_cache();
    } else {
      // A bad pointer never changes anything.
      const DevicePtr victim = std::next(live.begin(), static_cast<long>(rng() % live.size()))->first;
      REQUIRE(f.try_free(victim + 1) == kInvalidValue);  // never a block start: blocks are 512-aligned
    }
    // The test's own model of what is live.
    std::int64_t bytes = 0, requested = 0;
    for (const auto& [p, l] : live) {
      bytes += static_cast<std::int64_t>(l.rounded);
      requested += static_cast<std::int64_t>(l.size);
    }
    const DeviceStats s = f.stats();
    REQUIRE(s.allocation[StatType::aggregate].current == static_cast<std::int64_t>(live.size()));
    REQUIRE(s.requested_bytes[StatType::aggregate].current == requested);
    // Blocks may be handed out whole when the rest is too small to split.
    REQUIRE(s.allocated_bytes[StatType::aggregate].current >= bytes);
    REQUIRE(s.num_ooms == expected_ooms);
    REQUIRE(static_cast<std::size_t>(s.reserved_bytes[StatType::aggregate].current) == f.backend.used());
    // What the fences cost, as the backend counted it.
    REQUIRE(s.num_fences == f.backend.fence_records);
    REQUIRE(s.num_fence_events == f.backend.fence_event_records);
    REQUIRE(s.num_fence_stream_queries == f.backend.stream_queries);
  }
  for (const auto& [p, l] : live) f.free(p);
  f.empty_cache();
  CHECK(f.backend.used() == 0);
  return {f.stats(), oracle.waited_reuses()};
}

int steps_from_env(int fallback) {
  const char* e = std::getenv("CACHALLOC_RANDOM_STEPS");
  return e != nullptr ? std::atoi(e) : fallback;
}

}  // namespace

TEST_CASE("randomized: default configuration, roomy device") {
  std::int64_t fences = 0, queries = 0, fence_events = 0, deferred = 0, cross = 0;
  std::size_t waited = 0;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const Outcome o = run_random(seed, steps_from_env(1500), Config{}, 4 * GiB);
    fences += o.stats.num_fences;
    queries += o.stats.num_fence_stream_queries;
    fence_events += o.stats.num_fence_events;
    deferred += o.stats.num_deferred_frees;
    cross += o.stats.num_cross_stream_reuses;
    waited += o.waited_reuses;
  }
  CHECK(cross > 0);  // whole segments moved between streams, each checked by the oracle
  // Fences were recorded, over idle and busy non-blocking streams, and
  // addresses came back after waits for events or fences.
  CHECK(fences > 0);
  CHECK(queries == 2 * fences);
  CHECK(fence_events > fences);
  CHECK(deferred > 0);
  CHECK(waited > 0);
}

// Joins hand out blocks whose fences have not completed: the oracle accepts
// such a reuse only after a join of a fence recorded after the free.
TEST_CASE("randomized: fence joins, roomy and tight devices, classic and expandable") {
  std::int64_t joins = 0, deferred = 0;
  std::size_t waited = 0;
  for (bool expandable : {false, true}) {
    Config cfg;
    cfg.expandable_segments = expandable;
    for (std::uint64_t seed = 50; seed <= 53; ++seed) {
      const Outcome o = run_random(seed, steps_from_env(1500), cfg, seed % 2 ? 256 * MiB : 4 * GiB, true);
      joins += o.stats.num_fence_joins;
      deferred += o.stats.num_deferred_frees;
      waited += o.waited_reuses;
    }
  }
  CHECK(joins > 0);
  CHECK(deferred > 0);
  CHECK(waited > 0);
}

TEST_CASE("randomized: tight device, OOMs and retries") {
  std::int64_t ooms = 0, retries = 0, syncs = 0;
  for (std::uint64_t seed = 10; seed <= 13; ++seed) {
    const DeviceStats s = run_random(seed, steps_from_env(1500), Config{}, 256 * MiB).stats;
    ooms += s.num_ooms;
    retries += s.num_alloc_retries;
    syncs += s.num_sync_all_streams;
  }
  // The run must have gone down the paths it is meant to test.
  CHECK(ooms > 0);
  CHECK(retries > 0);
  CHECK(syncs > 0);
}

TEST_CASE("randomized: max_split_size, power-of-two rounding, GC and a memory fraction") {
  Config cfg;
  cfg.max_split_size = 32 * MiB;
  cfg.roundup_power2_divisions.fill(4);
  cfg.garbage_collection_threshold = 0.6;
  cfg.per_process_memory_fraction = 0.75;
  for (std::uint64_t seed = 20; seed <= 23; ++seed) run_random(seed, steps_from_env(1500), cfg, 512 * MiB);
}

TEST_CASE("randomized: expandable segments on a tight device") {
  Config cfg;
  cfg.expandable_segments = true;
  std::int64_t ooms = 0, device_frees = 0;
  for (std::uint64_t seed = 30; seed <= 33; ++seed) {
    const DeviceStats s = run_random(seed, steps_from_env(1500), cfg, 256 * MiB).stats;
    ooms += s.num_ooms;
    device_frees += s.num_device_free;
  }
  CHECK(ooms > 0);
  CHECK(device_frees > 0);  // pages were unmapped along the way
}

TEST_CASE("randomized: expandable segments with a fraction and max_split_size") {
  Config cfg;
  cfg.expandable_segments = true;
  cfg.per_process_memory_fraction = 0.8;
  cfg.max_split_size = 40 * MiB;
  for (std::uint64_t seed = 40; seed <= 43; ++seed) run_random(seed, steps_from_env(1500), cfg, 512 * MiB);
}

// Cross-stream reuse lending blocks of segments their streams still use
// (and of expandable reservations): the oracle accepts a block on another
// stream only once that stream waited for an event recorded on the block's
// stream after the free, or the free's events completed.
TEST_CASE("randomized: cross_stream_reuse:blocks, classic and expandable, roomy and tight") {
  std::int64_t cross = 0;
  for (bool expandable : {false, true}) {
    Config cfg;
    cfg.cross_stream_reuse = CrossStream::blocks;
    cfg.expandable_segments = expandable;
    for (std::uint64_t seed = 60; seed <= 63; ++seed)
      cross += run_random(seed, steps_from_env(1500), cfg, seed % 2 ? 256 * MiB : 4 * GiB, seed % 2 == 0)
                   .stats.num_cross_stream_reuses;
  }
  CHECK(cross > 0);
}

TEST_CASE("randomized: release_remap, expandable segments on a tight device, joins allowed") {
  Config cfg;
  cfg.expandable_segments = true;
  cfg.release_before_peak = true;
  cfg.release_remap = true;
  std::int64_t releases = 0;
  for (std::uint64_t seed = 50; seed <= 53; ++seed)
    releases += run_random(seed, steps_from_env(1500), cfg, 256 * MiB, true).stats.num_peak_releases;
  CHECK(releases > 0);  // runs moved between streams along the way
}
