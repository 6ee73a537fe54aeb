// test_pause.cpp — tags, pause and resume on the fake backend: segments of
// two tags never meet, the state machine, failures injected at every driver
// call of pause and resume (nothing lost, nothing leaked), and threads
// allocating while another pauses.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "pause_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

TEST_CASE("tags: blocks of two tags and untagged blocks never share a segment") {
  PauseFixture f;
  std::vector<std::pair<DevicePtr, TagId>> blocks;
  // Interleaved small and large requests of three tags, some freed so that
  // a cache shared across tags would hand one tag's block to another.
  for (int i = 0; i < 30; ++i) {
    const TagId t = static_cast<TagId>(i % 3);
    const std::size_t size = (i % 2) ? 3000 + 512 * i : 3 * MiB + 100 * KiB * i;
    blocks.emplace_back(t == kUntagged ? f.malloc(size) : f.tmalloc(size, t), t);
    if (i % 4 == 3) {
      if (blocks[i - 1].second == kUntagged) f.free(blocks[i - 1].first);
      else f.free(blocks[i - 1].first);
      blocks[i - 1].first = 0;
    }
  }
  for (auto [p, t] : blocks) {
    if (p == 0) continue;
    AddressInfo info;
    REQUIRE(f.alloc->query(p, &info) == kSuccess);
    CHECK(info.tag == t);
  }
  for (const SegmentInfo& seg : f.alloc->snapshot()) {
    if (seg.tag != kUntagged) CHECK(seg.expandable);  // tagged memory is always re-mappable
    for (const BlockInfo& b : seg.blocks) {
      if (b.state != BlockState::allocated) continue;
      AddressInfo info;
      REQUIRE(f.alloc->query(b.ptr, &info) == kSuccess);
      CHECK(info.tag == seg.tag);
    }
  }
}

TEST_CASE("tags: a freed block of one tag is never reused by another") {
  PauseFixture f;
  const DevicePtr a = f.tmalloc(4 * MiB, kKv);
  f.free(a);
  const DevicePtr w = f.tmalloc(4 * MiB, kWeights);
  const DevicePtr u = f.malloc(4 * MiB);
  CHECK(w != a);
  CHECK(u != a);
  // Pausing kv_cache must leave the weights' and untagged memory mapped:
  // touching them would throw in the fake if a page under them had gone.
  f.fill(w, 4 * MiB, 7);
  f.fill(u, 4 * MiB, 8);
  REQUIRE(f.pause(kKv) == kSuccess);
  CHECK(f.holds(w, 4 * MiB, 7));
  CHECK(f.holds(u, 4 * MiB, 8));
  REQUIRE(f.resume(kKv) == kSuccess);
}

TEST_CASE("tags: classic segments are not used for tags, expandable_segments or not") {
  for (bool expandable : {false, true}) {
    Config c;
    c.expandable_segments = expandable;
    PauseFixture f(c);
    f.tmalloc(1000, kKv);
    f.tmalloc(30 * MiB, kKv);
    f.malloc(1000);
    for (const SegmentInfo& seg : f.alloc->snapshot()) {
      if (seg.tag == kKv) CHECK(seg.expandable);
      if (seg.tag == kUntagged) CHECK(seg.expandable == expandable);
    }
  }
}

TEST_CASE("pause: releases every page of the tag, keeps addresses; resume restores the backup") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, true);
  const DevicePtr u = f.malloc(8 * MiB);
  const DevicePtr w1 = f.tmalloc(30 * MiB, kWeights);
  const DevicePtr w2 = f.tmalloc(5000, kWeights);
  const DevicePtr k1 = f.tmalloc(50 * MiB, kKv);
  const DevicePtr kfree = f.tmalloc(20 * MiB, kKv);
  f.free(kfree);  // cached free memory of the tag goes too
  f.fill(w1, 30 * MiB, 1);
  f.fill(w2, 5000, 2);
  f.fill(k1, 50 * MiB, 3);
  const std::size_t untagged_used = 20 * MiB;  // u's segment (one 20 MiB classic segment)
  const std::size_t before = f.backend.used();
  CHECK(before > untagged_used);

  bool no_op = true;
  REQUIRE(f.pause(kWeights, &no_op) == kSuccess);
  CHECK_FALSE(no_op);
  REQUIRE(f.pause(kKv) == kSuccess);
  CHECK(f.backend.used() == untagged_used);  // only the untagged segment holds memory
  CHECK(f.alloc->tag_paused(kWeights));
  CHECK_THROWS(f.holds(w1, 16, 1));         // its pages are gone
  CHECK(f.tag(kWeights).paused_bytes == f.tag(kWeights).reserved_bytes);
  CHECK(f.tag(kWeights).backup_bytes >= 30 * MiB + 5000);
  CHECK(f.tag(kKv).backup_bytes == 0);
  CHECK(f.reserved() == static_cast<std::int64_t>(untagged_used));

  // A second pause is a no-op; malloc in the paused tag is refused.
  REQUIRE(f.pause(kWeights, &no_op) == kSuccess);
  CHECK(no_op);
  DevicePtr p = 0;
  CHECK(f.alloc->malloc_tagged(&p, 1000, 0, kWeights) == kTagPaused);
  f.alloc->validate();
  // Other tags and untagged memory are served as usual.
  const DevicePtr other = f.tmalloc(3 * MiB, 3);
  f.free(other);

  REQUIRE(f.resume(kWeights, &no_op) == kSuccess);
  CHECK_FALSE(no_op);
  REQUIRE(f.resume(kKv) == kSuccess);
  REQUIRE(f.resume(kKv, &no_op) == kSuccess);
  CHECK(no_op);
  CHECK(f.holds(w1, 30 * MiB, 1));  // same addresses, contents restored
  CHECK(f.holds(w2, 5000, 2));
  CHECK_FALSE(f.holds(k1, 50 * MiB, 3));  // no backup: new pages
  f.fill(k1, 50 * MiB, 3);                // but mapped and usable
  CHECK(f.tag(kWeights).pauses == 1);
  CHECK(f.tag(kWeights).resumes == 1);
  CHECK(f.tag(kWeights).paused_bytes == 0);
  for (DevicePtr q : {u, w1, w2, k1}) f.free(q);
  f.empty_cache();
  CHECK(f.backend.used() == 0);
  CHECK(f.backend.live_handles() == 0);
}

TEST_CASE("resume maps consecutive paused pages as runs, and the next pause releases each run with one call") {
  // The driver's cost of a pause and a resume is per mapping (expandable.cpp):
  // 100 MiB of weights in 20 MiB pages, one block, must come back as one run.
  PauseFixture f;
  const DevicePtr w = f.tmalloc(100 * MiB, kWeights);
  const DevicePtr kept = f.tmalloc(20 * MiB, kWeights);  // the next range
  f.fill(w, 100 * MiB, 4);
  REQUIRE(f.pause(kWeights) == kSuccess);
  const int creates = f.backend.alloc_calls;
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.backend.alloc_calls - creates == 1);  // 120 MiB of consecutive pages: one run
  f.alloc->validate();
  f.fill(w, 100 * MiB, 5);
  CHECK(f.holds(w, 100 * MiB, 5));
  const int releases = f.backend.free_calls;
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(f.backend.free_calls - releases == 1);  // the run, whole
  CHECK(f.tag(kWeights).paused_bytes == f.tag(kWeights).reserved_bytes);
  f.alloc->validate();
  // A block freed while paused leaves a gap: two ranges, two runs.
  f.free(kept);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.backend.alloc_calls - creates == 2);
  CHECK(f.reserved() == static_cast<std::int64_t>(100 * MiB));
  f.alloc->validate();
  f.free(w);
  f.empty_cache();
  CHECK(f.backend.used() == 0);
  CHECK(f.backend.live_handles() == 0);
}

TEST_CASE("pause: freeing a paused tag's block touches no page; resume then empty_cache releases once") {
  PauseFixture f;
  const DevicePtr a = f.tmalloc(30 * MiB, kKv);
  const DevicePtr b = f.tmalloc(30 * MiB, kKv);
  REQUIRE(f.pause(kKv) == kSuccess);
  const int frees = f.backend.free_calls;
  f.free(a);  // metadata only (torch_memory_saver #92 released a handle twice here)
  CHECK(f.backend.free_calls == frees);
  f.empty_cache();  // a paused tag's pages are already gone: nothing to release
  CHECK(f.backend.free_calls == frees);
  REQUIRE(f.resume(kKv) == kSuccess);
  // The tag's reservation serves it again.
  const DevicePtr c = f.tmalloc(30 * MiB, kKv);
  AddressInfo ia, ic;
  REQUIRE(f.alloc->query(a, &ia) == kSuccess);
  REQUIRE(f.alloc->query(c, &ic) == kSuccess);
  CHECK(ia.segment == ic.segment);
  f.free(b);
  f.free(c);
  f.empty_cache();
  CHECK(f.backend.used() == 0);
  CHECK(f.backend.live_handles() == 0);
}

TEST_CASE("pause: a tag with an exported block is refused, loudly, and runs on untouched") {
  PauseFixture f;
  const DevicePtr w = f.tmalloc(4 * MiB, kWeights);
  const DevicePtr k = f.tmalloc(4 * MiB, kKv);
  f.fill(w, 4 * MiB, 7);
  REQUIRE(f.alloc->mark_range_exported(w, w + 4096) == 1);  // a dma-buf export of part of it
  const std::size_t used = f.backend.used();
  CHECK(f.pause(kWeights) == kInvalidValue);
  CHECK_FALSE(f.alloc->tag_paused(kWeights));
  CHECK(f.alloc->tag_failure(kWeights).find("exported") != std::string::npos);
  CHECK(f.backend.used() == used);  // no page released
  CHECK(f.holds(w, 4 * MiB, 7));
  CHECK(f.tag(kWeights).pauses == 0);
  // Another tag pauses as usual.
  CHECK(f.pause(kKv) == kSuccess);
  CHECK(f.resume(kKv) == kSuccess);
  // Once the program frees it, the block is retained for the importers and
  // never handed out again: nothing of the program can see the difference,
  // and the tag pauses.
  f.free(w);
  CHECK(f.pause(kWeights) == kSuccess);
  CHECK(f.resume(kWeights) == kSuccess);
  f.free(k);
}

TEST_CASE("pause: the untagged tag cannot be paused; an unknown tag resumes as a no-op") {
  PauseFixture f;
  CHECK(f.pause(kUntagged) == kInvalidValue);
  bool no_op = false;
  CHECK(f.resume(42, &no_op) == kSuccess);
  CHECK(no_op);
  CHECK(f.pause(42, &no_op) == kSuccess);  // nothing to release: paused, empty
  CHECK(f.resume(42, &no_op) == kSuccess);
  CHECK_FALSE(no_op);
}

TEST_CASE("pause: pending and deferred frees of the tag complete before its pages go") {
  PauseFixture f;
  const DevicePtr a = f.tmalloc(30 * MiB, kKv, 5);
  REQUIRE(f.alloc->record_stream(a, 6) == kSuccess);
  REQUIRE(f.alloc->free(a) == kSuccess);  // parked behind an event on stream 6
  const DevicePtr b = f.tmalloc(30 * MiB, kKv, 5);
  REQUIRE(f.alloc->free_deferred(b) == kSuccess);
  f.alloc->validate();
  const int syncs = f.backend.device_syncs;
  REQUIRE(f.pause(kKv) == kSuccess);
  CHECK(f.backend.device_syncs > syncs);
  CHECK(f.backend.used() == 0);
  REQUIRE(f.resume(kKv) == kSuccess);
  CHECK(f.backend.used() == 0);  // nothing was live: nothing to map again
}

// The backend's copies are asynchronous (cuMemcpy*Async on its copy
// stream): a pause that unmapped or released the tag's pages before its
// backup copies completed would back up garbage or fault on a GPU, and a
// resume that returned before its restore copies completed would hand the
// program its old-page contents for a while.  The fake models both (its
// copies move bytes only at copy_synchronize and it refuses to unmap pages
// or free host memory a copy in flight uses).
TEST_CASE("pause: the backup copies complete before any page goes; resume returns with the contents back") {
  SECTION("the fake's copies are asynchronous (else this test would prove nothing)") {
    PauseFixture f;
    const DevicePtr w = f.tmalloc(4096, kWeights);
    f.fill(w, 4096, 9);
    void* host = nullptr;
    REQUIRE(f.backend.host_alloc(4096, &host) == kSuccess);
    std::memset(host, 0, 4096);
    REQUIRE(f.backend.copy_to_host_async(host, w, 4096) == kSuccess);
    CHECK(f.backend.copies_in_flight() == 1);
    CHECK(static_cast<unsigned char*>(host)[1] == 0);  // not there yet
    CHECK_THROWS(f.backend.host_free(host));           // a copy in flight writes it
    REQUIRE(f.backend.copy_synchronize() == kSuccess);
    CHECK(f.backend.copies_in_flight() == 0);
    CHECK(static_cast<unsigned char*>(host)[1] == PauseFixture::period(9)[1]);
    f.backend.host_free(host);
    f.free(w);
  }
  SECTION("host backup") {
    PauseFixture f;
    f.alloc->set_tag_backup(kWeights, BackupMode::host);
    const DevicePtr w1 = f.tmalloc(70 * MiB, kWeights);  // two copy pieces
    const DevicePtr w2 = f.tmalloc(5000, kWeights);
    f.fill(w1, 70 * MiB, 4);
    f.fill(w2, 5000, 5);
    REQUIRE(f.pause(kWeights) == kSuccess);  // the fake throws at an unmap under a copy
    CHECK(f.backend.copies_in_flight() == 0);
    CHECK(f.backend.used() == 0);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(f.backend.copies_in_flight() == 0);
    CHECK(f.holds(w1, 70 * MiB, 4));
    CHECK(f.holds(w2, 5000, 5));
    // A second cycle reuses the host buffer: the copies into it still complete first.
    f.fill(w2, 5000, 6);
    REQUIRE(f.pause(kWeights) == kSuccess);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(f.holds(w2, 5000, 6));
    CHECK(f.holds(w1, 70 * MiB, 4));
  }
  SECTION("disk backup (staging halves written to the file only once their copies completed)") {
    TempDir dir;
    Config c;
    c.pause_backup_dir = dir.path;
    c.pause_backup_chunk = 4 * MiB;
    PauseFixture f(c);
    f.alloc->set_tag_backup(kWeights, BackupMode::disk);
    const DevicePtr w = f.tmalloc(10 * MiB, kWeights);  // three chunks
    f.fill(w, 10 * MiB, 7);
    REQUIRE(f.pause(kWeights) == kSuccess);
    CHECK(f.backend.copies_in_flight() == 0);
    CHECK(f.backend.used() == 0);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(f.backend.copies_in_flight() == 0);
    CHECK(f.holds(w, 10 * MiB, 7));
  }
}

TEST_CASE("resume: out of memory leaves the tag paused and resumable later") {
  PauseFixture f({}, 1 * GiB);
  f.alloc->set_tag_backup(kWeights, true);
  const DevicePtr w = f.tmalloc(100 * MiB, kWeights);
  f.fill(w, 100 * MiB, 9);
  REQUIRE(f.pause(kWeights) == kSuccess);
  f.backend.set_foreign_usage(1 * GiB - 50 * MiB);  // another engine took the memory
  CHECK(f.resume(kWeights) == kOutOfMemory);
  CHECK(f.alloc->tag_paused(kWeights));
  CHECK(f.backend.used() == 0);
  f.backend.set_foreign_usage(0);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 100 * MiB, 9));
}

TEST_CASE("resume: a backed-up block freed while paused is not restored (its pages are gone)") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, true);
  const DevicePtr a = f.tmalloc(60 * MiB, kWeights);
  const DevicePtr b = f.tmalloc(30 * MiB, kWeights);
  f.fill(b, 30 * MiB, 4);
  REQUIRE(f.pause(kWeights) == kSuccess);
  f.free(a);  // its whole pages are forgotten at resume; the fake throws on a copy there
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(b, 30 * MiB, 4));
  f.free(b);
}

TEST_CASE("resume: out of memory first gives cached memory back, then retries") {
  PauseFixture f({}, 200 * MiB);
  const DevicePtr w = f.tmalloc(60 * MiB, kWeights);
  REQUIRE(f.pause(kWeights) == kSuccess);
  const DevicePtr other = f.malloc(150 * MiB);  // another engine, untagged, then freed: cached
  f.free(other);
  CHECK(f.backend.used() == 150 * MiB);
  REQUIRE(f.resume(kWeights) == kSuccess);  // 60 MiB more would not fit beside the cache
  CHECK(f.backend.used() == 60 * MiB);
  f.free(w);
}

TEST_CASE("pause: a failure at any driver call loses nothing and leaks nothing") {
  int n = 0;
  while (run_with_fault(n, false)) ++n;
  CHECK(n > 10);  // the scenario makes that many calls
}

TEST_CASE("resume: a failure at any driver call loses nothing and leaks nothing") {
  int n = 0;
  while (run_with_fault(n, true)) ++n;
  CHECK(n > 10);
}

TEST_CASE("pause: threads allocating in every tag while another pauses and resumes", "[threads]") {
  PauseFixture f({}, 4 * GiB);
  f.alloc->set_tag_backup(kWeights, true);
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0};
  std::atomic<int> errors{0};  // (Catch's assertions are not thread-safe: counted here, checked after)
  auto worker = [&](TagId tag, StreamId stream) {
    std::vector<DevicePtr> held;
    unsigned r = static_cast<unsigned>(tag * 7919 + stream);
    while (!stop.load()) {
      r = r * 1103515245 + 12345;
      const std::size_t size = (r >> 8) % 2 ? 512 + (r >> 12) % 8192 : 1 * MiB + (r >> 12) % (24 * MiB);
      DevicePtr p = 0;
      const Status st = f.alloc->malloc_tagged(&p, size, stream, tag);
      if (st == kTagPaused) ++refused;
      else if (st == kSuccess) held.push_back(p);
      else ++errors;
      if (held.size() > 8 || (!held.empty() && (r >> 20) % 3 == 0)) {
        if (f.alloc->free(held.front()) != kSuccess) ++errors;  // also while paused
        held.erase(held.begin());
      }
    }
    for (DevicePtr p : held)
      if (f.alloc->free(p) != kSuccess) ++errors;
  };
  std::vector<std::thread> threads;
  threads.emplace_back(worker, kUntagged, 0);
  threads.emplace_back(worker, kWeights, 0);
  threads.emplace_back(worker, kKv, 3);
  int cycle_errors = 0;
  for (int i = 0; i < 200; ++i) {
    cycle_errors += f.alloc->pause(kWeights) != kSuccess;
    cycle_errors += f.alloc->pause(kKv) != kSuccess;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the workers meet the paused tags
    cycle_errors += f.alloc->resume(kKv) != kSuccess;
    cycle_errors += f.alloc->resume(kWeights) != kSuccess;
  }
  stop = true;
  for (auto& t : threads) t.join();
  CHECK(cycle_errors == 0);
  CHECK(errors == 0);
  CHECK(refused > 0);  // the workers did meet paused tags
  f.alloc->validate();
  f.empty_cache();
  CHECK(f.backend.used() == 0);
  CHECK(f.backend.live_handles() == 0);
}
