// test_owner_ledger.cpp — blocks held for an owner token (core/ledger_owners.cpp):
// what a graph capture's frees and allocations become.  validate() runs
// after every step (the fixtures).
#include <catch2/catch.hpp>

#include "alloc_fixture.h"
#include "pause_fixture.h"

using namespace cachalloc;
using cachalloc::testing::AllocFixture;
using cachalloc::testing::PauseFixture;
using cachalloc::testing::kWeights;

namespace {
constexpr std::uint64_t kToken = 7;
}

TEST_CASE("owner ledger: a held block is never reused until its token is released, then after a fence") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const DevicePtr keep = f.malloc(4096);
  REQUIRE(f.alloc->hold_for(a, kToken) == kSuccess);
  f.alloc->validate();
  CHECK_FALSE(f.alloc->is_live(a));                     // freed for the program
  CHECK(f.alloc->free(a) == kInvalidValue);             // a second free is a double free
  CHECK(f.stats().capture_held_bytes.current == 4096);  // and the dump says how much
  for (int i = 0; i < 64; ++i) CHECK(f.malloc(4096) != a);
  CHECK(f.alloc->release_owner(kToken) == 4096);
  f.alloc->validate();
  CHECK(f.stats().capture_held_bytes.current == 0);
  CHECK(f.stats().deferred_free_bytes.current == 4096);  // behind a fence: graph launches may still run
  f.alloc->reclaim();  // the fence is recorded
  f.backend.complete_all_events();
  f.alloc->reclaim();  // and seen complete
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(f.malloc(4096) == a);
  (void)keep;
}

TEST_CASE("owner ledger: a block allocated under a token is held at its later free while the token lives") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  REQUIRE(f.alloc->mark_owner(a, kToken) == kSuccess);
  CHECK(f.alloc->owner_of(a) == kToken);
  REQUIRE(f.alloc->free(a) == kSuccess);  // held, not freed
  f.alloc->validate();
  CHECK(f.stats().capture_held_bytes.current == 4096);
  CHECK(f.malloc(4096) != a);
  f.alloc->release_owner(kToken);
  // After the release, a marked live block frees as usual.
  const DevicePtr b = f.malloc(8192);
  REQUIRE(f.alloc->mark_owner(b, kToken + 1) == kSuccess);
  f.alloc->release_owner(kToken + 1);
  REQUIRE(f.alloc->free(b) == kSuccess);
  f.alloc->validate();
  CHECK(f.stats().capture_held_bytes.current == 0);
}

TEST_CASE("owner ledger: unknown and interior pointers change nothing") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  CHECK(f.alloc->hold_for(a + 512, kToken) == kInvalidValue);
  CHECK(f.alloc->hold_for(0x1, kToken) == kNotOwned);
  CHECK(f.alloc->is_live(a));
  f.free(a);
}

TEST_CASE("owner ledger: pause and resume keep a held tagged block's pages at the same address") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, true);
  const DevicePtr w = f.tmalloc(4 * MiB, kWeights);
  f.fill(w, 4 * MiB, 9);
  REQUIRE(f.alloc->hold_for(w, kToken) == kSuccess);  // freed during a capture: the graph still uses it
  f.alloc->validate();
  REQUIRE(f.pause(kWeights) == kSuccess);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 4 * MiB, 9));  // the graph's data is back where the graph reads it
  f.alloc->release_owner(kToken);
  f.alloc->validate();
}
