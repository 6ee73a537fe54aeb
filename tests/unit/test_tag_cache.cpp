// test_tag_cache.cpp — one tag's cache on the fake backend: empty_tag_cache
// gives back that tag's free pages only (torch_memory_saver's disable()
// region, whose memory goes back when it ends), and the memory margin of
// tagged allocations (memory_margin_bytes).
#include "pause_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

TEST_CASE("empty_tag_cache: the tag's free pages go back; other tags and untagged memory keep their cache") {
  PauseFixture f;
  const DevicePtr u = f.malloc(8 * MiB);
  const DevicePtr w = f.tmalloc(40 * MiB, kWeights);
  const DevicePtr w_live = f.tmalloc(3 * MiB, kWeights);
  const DevicePtr k = f.tmalloc(40 * MiB, kKv);
  f.fill(w_live, 3 * MiB, 1);
  for (DevicePtr p : {u, w, k}) f.free(p);
  const std::size_t before = f.backend.used();
  const std::size_t weights_before = f.tag(kWeights).reserved_bytes;
  f.alloc->empty_tag_cache(kWeights);
  f.alloc->validate();
  CHECK(f.backend.used() == before - 40 * MiB);          // the weights' free large pages, no more
  CHECK(f.tag(kWeights).reserved_bytes == weights_before - 40 * MiB);
  CHECK(f.holds(w_live, 3 * MiB, 1));                     // a live block keeps its pages
  const DevicePtr k2 = f.tmalloc(40 * MiB, kKv);          // kv_cache's cache is still there
  CHECK(f.backend.used() == before - 40 * MiB);
  const DevicePtr u2 = f.malloc(8 * MiB);                 // and the untagged cache
  CHECK(f.backend.used() == before - 40 * MiB);
  f.alloc->empty_tag_cache(kUntagged);                    // (untagged: empty_cache's job, nothing here)
  CHECK(f.backend.used() == before - 40 * MiB);
  for (DevicePtr p : {k2, u2, w_live}) f.free(p);
  f.alloc->empty_tag_cache(kWeights);
  f.alloc->empty_tag_cache(kKv);
  f.alloc->validate();
  CHECK(f.tag(kWeights).reserved_bytes == 0);
  CHECK(f.tag(kKv).reserved_bytes == 0);
  CHECK(f.backend.used() == 20 * MiB);  // the untagged segment, cached
}

TEST_CASE("empty_tag_cache: nothing for a paused tag; its pages come back at the resume") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, BackupMode::host);
  const DevicePtr w = f.tmalloc(30 * MiB, kWeights);
  f.fill(w, 30 * MiB, 2);
  REQUIRE(f.pause(kWeights) == kSuccess);
  f.alloc->empty_tag_cache(kWeights);
  f.alloc->validate();
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 30 * MiB, 2));
  f.free(w);
}

TEST_CASE("memory margin: a tagged allocation that would map into the margin fails; untagged ones and the tag's cache do not") {
  PauseFixture f({}, 1 * GiB);
  f.alloc->set_tag_memory_margin(900 * MiB);
  DevicePtr p = 0;
  CHECK(f.alloc->malloc_tagged(&p, 200 * MiB, 0, kKv) == kOutOfMemory);  // 1 GiB - 200 MiB < 900 MiB
  f.alloc->validate();
  CHECK(f.tag(kKv).reserved_bytes == 0);
  const DevicePtr k = f.tmalloc(100 * MiB, kKv);  // leaves 924 MiB free
  const DevicePtr u = f.malloc(200 * MiB);        // untagged: no margin
  f.free(k);
  const DevicePtr k_again = f.tmalloc(100 * MiB, kKv);  // the tag's cache: no new memory, no margin
  CHECK(k_again == k);
  CHECK(f.alloc->malloc_tagged(&p, 40 * MiB, 0, kWeights) == kOutOfMemory);  // 724 MiB free already
  f.alloc->set_tag_memory_margin(0);
  const DevicePtr k2 = f.tmalloc(200 * MiB, kKv);
  for (DevicePtr q : {k_again, u, k2}) f.free(q);
}
