// test_allocator.cpp — pools, best fit, splitting, merging, release rules,
// max_split_size and bad pointers, on one stream.
#include "alloc_fixture.h"
#include "size_policy.h"

using namespace cachalloc;
using namespace cachalloc::testing;

TEST_CASE("a small request carves a 2 MiB segment; the next one reuses it") {
  AllocFixture f;
  const DevicePtr a = f.malloc(1000);
  CHECK(f.backend.alloc_calls == 1);
  CHECK(f.reserved() == static_cast<std::int64_t>(2 * MiB));
  CHECK(f.allocated() == 1024);
  const DevicePtr b = f.malloc(4096);
  CHECK(f.backend.alloc_calls == 1);
  CHECK(b == a + 1024);  // best fit takes the tail right after a
  const auto s = f.stats();
  CHECK(s.segment[StatType::small_pool].current == 1);
  CHECK(s.inactive_split[StatType::small_pool].current == 1);
  CHECK(s.inactive_split_bytes[StatType::small_pool].current == static_cast<std::int64_t>(2 * MiB - 1024 - 4096));
  CHECK(s.requested_bytes[StatType::aggregate].current == 5096);
}

TEST_CASE("1-10 MiB requests get a 20 MiB segment, larger ones their size rounded to 2 MiB") {
  AllocFixture f;
  f.malloc(3 * MiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
  f.malloc(9 * MiB);  // fits the 17 MiB tail of the first segment
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
  f.malloc(11 * MiB + 1);  // the 8 MiB left does not fit: 12 MiB segment
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB + 12 * MiB));
  CHECK(f.stats().segment[StatType::large_pool].current == 2);
}

TEST_CASE("freed blocks are reused without a device call and merge with free neighbours") {
  AllocFixture f;
  const DevicePtr a = f.malloc(512);
  const DevicePtr b = f.malloc(512);
  const DevicePtr c = f.malloc(512);
  f.free(a);
  f.free(c);  // c merges with the tail of the segment
  CHECK(f.stats().inactive_split[StatType::aggregate].current == 2);
  f.free(b);  // a, b and the tail become one whole free block again
  CHECK(f.stats().inactive_split[StatType::aggregate].current == 0);
  CHECK(f.stats().active[StatType::aggregate].current == 0);
  const DevicePtr d = f.malloc(1 * MiB);  // the merged block starts at a again
  CHECK(d == a);
  CHECK(f.backend.alloc_calls == 1);
}

TEST_CASE("best fit picks the smallest cached block that fits") {
  AllocFixture f;
  // Three separate large segments, freed, of 12, 16 and 14 MiB.
  const DevicePtr a = f.malloc(12 * MiB);
  const DevicePtr b = f.malloc(16 * MiB);
  const DevicePtr c = f.malloc(14 * MiB);
  f.free(a);
  f.free(b);
  f.free(c);
  CHECK(f.malloc(13 * MiB) == c);
  CHECK(f.malloc(11 * MiB) == a);
  CHECK(f.backend.alloc_calls == 3);
}

TEST_CASE("split rules: small remainder >= 512 B, large remainder > 1 MiB") {
  AllocFixture f;
  SECTION("large: a remainder of exactly 1 MiB is not split off") {
    const DevicePtr a = f.malloc(12 * MiB);
    f.free(a);
    f.malloc(11 * MiB);  // remainder 1 MiB: block handed out whole
    CHECK(f.allocated() == static_cast<std::int64_t>(12 * MiB));
    CHECK(f.stats().inactive_split[StatType::large_pool].current == 0);
  }
  SECTION("large: a remainder above 1 MiB is split off") {
    const DevicePtr a = f.malloc(12 * MiB);
    f.free(a);
    f.malloc(11 * MiB - 512);
    CHECK(f.allocated() == static_cast<std::int64_t>(11 * MiB - 512));
    CHECK(f.stats().inactive_split_bytes[StatType::large_pool].current == static_cast<std::int64_t>(1 * MiB + 512));
  }
  SECTION("small: a 512 B remainder is kept") {
    f.malloc(1 * MiB);
    f.malloc(1 * MiB - 512);
    CHECK(f.stats().inactive_split_bytes[StatType::small_pool].current == 512);
    f.malloc(512);  // takes the last 512 B: the segment is full, nothing inactive
    CHECK(f.stats().inactive_split[StatType::small_pool].current == 0);
    CHECK(f.backend.alloc_calls == 1);
  }
}

TEST_CASE("a segment goes back to the device only when whole and free") {
  AllocFixture f;
  const DevicePtr a = f.malloc(512);
  const DevicePtr b = f.malloc(512);
  f.free(a);
  f.empty_cache();
  CHECK(f.backend.free_calls == 0);  // b still lives in the segment
  CHECK(f.reserved() == static_cast<std::int64_t>(2 * MiB));
  f.free(b);
  f.empty_cache();
  CHECK(f.backend.free_calls == 1);
  CHECK(f.reserved() == 0);
  CHECK(f.backend.live_segments() == 0);
  CHECK(f.stats().num_device_free == 1);
}

TEST_CASE("max_split_size: oversize blocks are never split and serve only near-fitting requests") {
  AllocFixture f(config_with_max_split(64));
  const DevicePtr big = f.malloc(100 * MiB);
  CHECK(f.stats().oversize_allocations.current == 1);
  CHECK(f.stats().oversize_segments.current == 1);
  f.free(big);
  SECTION("a request below max_split_size never takes an oversize block") {
    f.malloc(30 * MiB);
    CHECK(f.backend.alloc_calls == 2);
  }
  SECTION("an oversize request within max_non_split_rounding (20 MiB) reuses it whole") {
    CHECK(f.malloc(81 * MiB) == big);
    CHECK(f.allocated() == static_cast<std::int64_t>(100 * MiB));  // not split
    CHECK(f.stats().inactive_split[StatType::aggregate].current == 0);
  }
  SECTION("an oversize request 20 MiB or more smaller does not") {
    f.malloc(80 * MiB);
    CHECK(f.backend.alloc_calls == 2);
  }
  CHECK(f.stats().max_split_size == static_cast<std::int64_t>(64 * MiB));
}

TEST_CASE("max_non_split_rounding is configurable") {
  Config c = config_with_max_split(64);
  c.max_non_split_rounding = 50 * MiB;
  AllocFixture f(c);
  const DevicePtr big = f.malloc(100 * MiB);
  f.free(big);
  CHECK(f.malloc(70 * MiB) == big);
}

TEST_CASE("bad pointers: null, foreign, double free, interior — nothing changes") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const DevicePtr b = f.malloc(4096);
  const auto before = f.stats();
  CHECK(f.try_free(0) == kSuccess);
  CHECK(f.try_free(0x1000) == kNotOwned);
  CHECK(f.try_free(a + 512) == kInvalidValue);  // interior pointer
  f.free(a);
  CHECK(f.try_free(a) == kInvalidValue);        // double free
  CHECK(f.try_free(a + 8192 + 1 * MiB) == kInvalidValue);  // in the segment's free tail
  CHECK(f.stats().allocation[StatType::aggregate].current == before.allocation[StatType::aggregate].current - 1);
  CHECK(f.backend.free_calls == 0);
  f.free(b);
}

TEST_CASE("zero-byte and null-output requests are invalid") {
  AllocFixture f;
  DevicePtr p = 0;
  CHECK(f.alloc->malloc(&p, 0, 0) == kInvalidValue);
  CHECK(f.alloc->malloc(nullptr, 16, 0) == kInvalidValue);
  CHECK(f.backend.alloc_calls == 0);
}

TEST_CASE("addresses are aligned to 512 B") {
  AllocFixture f;
  for (std::size_t s : {1u, 100u, 513u, 4000u, 70000u})
    CHECK(f.malloc(s) % 512 == 0);
}

TEST_CASE("snapshot lists segments and blocks in address order with their states") {
  AllocFixture f;
  const DevicePtr a = f.malloc(1000);
  f.malloc(2000);
  f.free(a);
  const auto snap = f.alloc->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].size == 2 * MiB);
  CHECK(snap[0].small_pool);
  REQUIRE(snap[0].blocks.size() == 3);
  CHECK(snap[0].blocks[0].state == BlockState::inactive);
  CHECK(snap[0].blocks[1].state == BlockState::allocated);
  CHECK(snap[0].blocks[1].requested == 2000);
  CHECK(snap[0].blocks[2].state == BlockState::inactive);
}

TEST_CASE("the destructor returns cached segments to the backend") {
  FakeBackend backend;
  {
    CachingAllocator alloc(&backend, Config{});
    DevicePtr p = 0;
    REQUIRE(alloc.malloc(&p, 5 * MiB, 0) == kSuccess);
    REQUIRE(alloc.free(p) == kSuccess);
  }
  CHECK(backend.live_segments() == 0);
}
