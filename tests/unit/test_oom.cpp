// test_oom.cpp — the out-of-memory path, the memory fraction and garbage
// collection, with device failures injected by the fake backend.
#include "alloc_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

struct OomCatcher : AllocatorObserver {
  int ooms = 0;
  OomReport last;
  void on_event(int, const TraceEvent&) override {}
  void on_oom(int, const OomReport& r) override {
    ++ooms;
    last = r;
  }
};

}  // namespace

TEST_CASE("device OOM: a cached fit needs no device call; otherwise flush and retry once") {
  AllocFixture f;
  const DevicePtr a = f.malloc(40 * MiB);
  const DevicePtr b = f.malloc(64 * MiB);
  f.free(a);
  f.free(b);
  f.backend.fail_next_allocs(1);
  f.malloc(30 * MiB);  // the cached 40 MiB block fits: the armed failure is not hit
  CHECK(f.stats().num_alloc_retries == 0);
  CHECK(f.backend.failed_allocs == 0);
  // 100 MiB: first device call fails; no single cached segment is that big,
  // so every whole cached segment (b) is released and the retry succeeds.
  f.malloc(100 * MiB);
  CHECK(f.backend.failed_allocs == 1);
  CHECK(f.stats().num_alloc_retries == 1);
  CHECK_FALSE(f.backend.has_segment(b));
  CHECK(f.backend.has_segment(a));  // split and partly live: not releasable
}

TEST_CASE("device OOM: the single released segment is the smallest big enough") {
  Config cfg;
  cfg.cross_stream_reuse = CrossStream::off;  // else stream 0x77 takes b, ordered (test_cross_stream.cpp)
  AllocFixture f(cfg);
  const DevicePtr a = f.malloc(40 * MiB);
  const DevicePtr b = f.malloc(60 * MiB);
  const DevicePtr c = f.malloc(24 * MiB);
  f.free(a);
  f.free(b);
  f.free(c);
  f.backend.fail_next_allocs(1);
  f.malloc(50 * MiB, 0x77);  // other stream: cached blocks do not serve it; 60 MiB released
  CHECK(f.stats().num_alloc_retries == 1);
  CHECK_FALSE(f.backend.has_segment(b));
  CHECK(f.backend.has_segment(a));
  CHECK(f.backend.has_segment(c));
}

TEST_CASE("device OOM: then every cached segment is released, then failure is counted") {
  Config cfg;
  AllocFixture f(cfg, 100 * MiB);
  OomCatcher catcher;
  f.alloc->set_observer(&catcher);
  const DevicePtr a = f.malloc(30 * MiB);
  const DevicePtr b = f.malloc(30 * MiB);
  const DevicePtr live = f.malloc(20 * MiB);
  f.free(a);
  f.free(b);
  // 50 MiB on another stream: no cached block, device has 20 MiB free; no single
  // cached segment is >= 50 MiB; releasing both (60 MiB) makes room.
  f.malloc(50 * MiB, 0x5);
  CHECK(f.stats().num_alloc_retries == 1);
  CHECK(f.backend.live_segments() == 2);
  // Now nothing can make room for 60 MiB.
  DevicePtr p = 0;
  CHECK(f.try_malloc(60 * MiB, 0x5, &p) == kOutOfMemory);
  CHECK(p == 0);
  CHECK(f.stats().num_ooms == 1);
  REQUIRE(catcher.ooms == 1);
  CHECK(catcher.last.requested == 60 * MiB);
  CHECK(catcher.last.device_total == 100 * MiB);
  CHECK(catcher.last.allocated == 70 * MiB);
  // And the allocator still works afterwards.
  f.free(live);
  f.malloc(10 * MiB);
}

TEST_CASE("per_process_memory_fraction caps reserved memory even when the device has room") {
  Config cfg;
  cfg.per_process_memory_fraction = 0.5;
  AllocFixture f(cfg, 100 * MiB);
  CHECK(f.alloc->allowed_bytes() == 50 * MiB);
  const DevicePtr a = f.malloc(30 * MiB);
  DevicePtr p = 0;
  CHECK(f.try_malloc(30 * MiB, 0, &p) == kOutOfMemory);
  CHECK(f.backend.alloc_calls == 1);  // the cap failed it without asking the device
  CHECK(f.stats().num_ooms == 1);
  f.free(a);
  // With a cached free: the OOM path releases it and the retry fits.
  f.malloc(40 * MiB, 0x9);
  CHECK(f.reserved() == static_cast<std::int64_t>(40 * MiB));
}

TEST_CASE("garbage collection releases the segments idle longest past the threshold") {
  Config cfg;
  cfg.garbage_collection_threshold = 0.5;  // of 200 MiB: collect above 100 MiB reserved
  cfg.cross_stream_reuse = CrossStream::off;  // one stream per segment: none takes another's (test_cross_stream.cpp)
  AllocFixture f(cfg, 200 * MiB);
  const DevicePtr old_block = f.malloc(30 * MiB, 0x1);
  f.free(old_block);
  for (int i = 0; i < 10; ++i) f.free(f.malloc(12 * MiB, 0x2));  // ages old_block by ~11 lookups
  const DevicePtr fresh = f.malloc(40 * MiB, 0x3);
  f.free(fresh);
  f.malloc(30 * MiB, 0x4);  // reserved 82 MiB before: no collection
  CHECK(f.backend.has_segment(old_block));
  CHECK(f.reserved() == static_cast<std::int64_t>(112 * MiB));
  f.malloc(30 * MiB, 0x5);  // 112 MiB > 100 MiB: the oldest idle segment goes
  CHECK_FALSE(f.backend.has_segment(old_block));
  CHECK(f.backend.has_segment(fresh));
  CHECK(f.reserved() == static_cast<std::int64_t>(112 * MiB));
}

TEST_CASE("garbage collection is off by default") {
  AllocFixture f(Config{}, 200 * MiB);
  const DevicePtr old_block = f.malloc(30 * MiB, 0x1);
  f.free(old_block);
  for (int i = 0; i < 5; ++i) f.malloc(30 * MiB, 0x10 + i);
  CHECK(f.backend.has_segment(old_block));
}
