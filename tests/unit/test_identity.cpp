// test_identity.cpp — what the core says about addresses (the answers behind
// cuMemGetAddressRange / cuPointerGetAttribute), blocks exported through IPC
// (retained after their free, never reused while their segment lives), and
// peer access to expandable pages.
#include "alloc_fixture.h"
#include "size_policy.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

AddressInfo query(AllocFixture& f, DevicePtr p) {
  AddressInfo info;
  REQUIRE(f.alloc->query(p, &info) == kSuccess);
  return info;
}

void export_block(AllocFixture& f, DevicePtr p) {
  const AddressInfo info = query(f, p);
  REQUIRE(info.live);
  REQUIRE(f.alloc->mark_exported(info.block, info.id) == kSuccess);
  f.alloc->validate();
}

}  // namespace

TEST_CASE("identity: a live block is described by its start and requested size, from any interior pointer") {
  AllocFixture f;
  const DevicePtr a = f.malloc(1000);
  const DevicePtr b = f.malloc(3000);
  CHECK(b == a + 1024);  // the same 2 MiB segment: b's neighbour is a
  for (DevicePtr p : {b, b + 1, b + 2999}) {
    const AddressInfo info = query(f, p);
    CHECK(info.live);
    CHECK(info.block == b);
    CHECK(info.requested == 3000);
    CHECK(info.segment == a);
    CHECK(info.segment_size == 2 * MiB);
  }
  CHECK(query(f, a + 999).block == a);
  // Past the requested size (rounding slack) the driver would say "not allocated".
  CHECK_FALSE(query(f, a + 1000).live);
  CHECK_FALSE(query(f, b + 3000).live);
  // The rest of the segment is cached memory.
  CHECK_FALSE(query(f, b + 8192).live);
  AddressInfo outside;
  CHECK(f.alloc->query(a + 2 * MiB, &outside) == kNotOwned);
  CHECK(f.alloc->query(a - 1, &outside) == kNotOwned);
}

TEST_CASE("identity: a freed block answers as freed memory, and a new allocation at its address gets a new id") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const std::uint64_t first = query(f, a).id;
  f.free(a);
  CHECK_FALSE(query(f, a).live);
  const DevicePtr again = f.malloc(4096);
  REQUIRE(again == a);
  CHECK(query(f, a).live);
  CHECK(query(f, a).id != first);
  const DevicePtr other = f.malloc(4096);
  CHECK(query(f, other).id != query(f, a).id);
}

TEST_CASE("ipc: an exported block is not reused after its free while its segment lives") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const DevicePtr b = f.malloc(4096);  // keeps the segment busy
  export_block(f, a);
  CHECK(query(f, a).exported);
  f.free(a);
  CHECK_FALSE(query(f, a).live);
  // The same size again comes from elsewhere in the segment, never from a.
  for (int i = 0; i < 8; ++i) CHECK(f.malloc(4096) != a);
  const auto snap = f.alloc->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].blocks[0].state == BlockState::pending_free);
  // Retained memory counts as active, not as allocated.
  CHECK(f.stats().active_bytes[StatType::aggregate].current >
        f.stats().allocated_bytes[StatType::aggregate].current);
  (void)b;
}

TEST_CASE("ipc: a segment of only free and retained blocks goes back to the driver at once") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const DevicePtr b = f.malloc(4096);
  const DevicePtr seg = query(f, a).segment;
  export_block(f, a);
  f.free(a);
  CHECK(f.backend.has_segment(seg));  // b still lives there
  CHECK(f.backend.free_calls == 0);
  f.free(b);                          // the last busy block: the segment is released
  CHECK_FALSE(f.backend.has_segment(seg));
  CHECK(f.backend.free_calls == 1);
  CHECK(f.reserved() == 0);
  CHECK(f.stats().active[StatType::aggregate].current == 0);
  CHECK(f.stats().inactive_split[StatType::aggregate].current == 0);
}

TEST_CASE("ipc: an exported block freed last releases its segment itself") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const DevicePtr b = f.malloc(4096);
  export_block(f, b);
  f.free(a);
  f.free(b);
  CHECK(f.reserved() == 0);
  CHECK(f.backend.live_segments() == 0);
}

TEST_CASE("ipc: a retained block waits for the events of its neighbours before the segment goes") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096, 7);
  const DevicePtr b = f.malloc(4096, 7);
  const DevicePtr seg = query(f, a).segment;
  export_block(f, a);
  REQUIRE(f.alloc->record_stream(b, 9) == kSuccess);
  f.free(b);  // pending on stream 9's event
  f.free(a);  // retained; the segment still has a pending block
  CHECK(f.backend.has_segment(seg));
  f.backend.complete_all_events();
  const DevicePtr c = f.malloc(512, 7);  // completes b's event first: the old segment goes back
  CHECK_FALSE(f.backend.has_segment(seg));
  CHECK(f.backend.live_segments() == 1);
  CHECK(f.reserved() == static_cast<std::int64_t>(2 * MiB));
  f.free(c);
}

TEST_CASE("ipc: the export of a stale allocation is refused") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const AddressInfo info = query(f, a);
  f.free(a);
  CHECK(f.alloc->mark_exported(info.block, info.id) == kInvalidValue);
  const DevicePtr again = f.malloc(4096);
  REQUIRE(again == a);
  CHECK(f.alloc->mark_exported(info.block, info.id) == kInvalidValue);  // same address, another allocation
  f.alloc->validate();
}

TEST_CASE("ipc: blocks of expandable segments cannot be exported") {
  Config c;
  c.expandable_segments = true;
  AllocFixture f(c, 1 * GiB);
  const DevicePtr a = f.malloc(4096);
  const AddressInfo info = query(f, a);
  CHECK(info.expandable);
  CHECK(f.alloc->mark_exported(info.block, info.id) == kNotSupported);
}

TEST_CASE("peer access: mapped pages are granted now and pages mapped later too; revoked on disable") {
  Config c;
  c.expandable_segments = true;
  AllocFixture f(c, 1 * GiB);
  const DevicePtr a = f.malloc(1000);
  CHECK_FALSE(f.backend.peer_can_access(1, a));
  REQUIRE(f.alloc->set_peer_access(1, true) == kSuccess);
  CHECK(f.backend.peer_can_access(1, a));
  const DevicePtr big = f.malloc(30 * MiB);  // new pages in the large pool
  CHECK(f.backend.peer_can_access(1, big));
  CHECK(f.backend.peer_can_access(1, big + 25 * MiB));
  CHECK_FALSE(f.backend.peer_can_access(2, big));
  REQUIRE(f.alloc->set_peer_access(1, false) == kSuccess);
  CHECK_FALSE(f.backend.peer_can_access(1, a));
  CHECK_FALSE(f.backend.peer_can_access(1, big));
  const DevicePtr later = f.malloc(30 * MiB);
  CHECK_FALSE(f.backend.peer_can_access(1, later));
}

TEST_CASE("peer access: a grow of several runs is granted whole, the last run included") {
  Config c;
  c.expandable_segments = true;
  AllocFixture f(c, 1 * GiB);
  REQUIRE(f.alloc->set_peer_access(1, true) == kSuccess);
  const DevicePtr big = f.malloc(150 * MiB);  // 8 pages of 20 MiB: runs of 60, 60 and 40 MiB
  CHECK(f.backend.live_mappings() == 3);
  for (std::size_t off : {std::size_t{0}, 60 * MiB - 1, 60 * MiB, 120 * MiB, 150 * MiB - 1})
    CHECK(f.backend.peer_can_access(1, big + off));
  REQUIRE(f.alloc->set_peer_access(1, false) == kSuccess);
  CHECK_FALSE(f.backend.peer_can_access(1, big + 128 * MiB));
}

TEST_CASE("peer access: a failed grant while mapping rolls the mapping back and fails the allocation") {
  Config c;
  c.expandable_segments = true;
  AllocFixture f(c, 1 * GiB);
  REQUIRE(f.alloc->set_peer_access(1, true) == kSuccess);
  f.backend.fail_next_access(1);
  CHECK(f.try_malloc(1000) == kInvalidValue);
  CHECK(f.backend.live_mappings() == 0);
  CHECK(f.reserved() == 0);
  const DevicePtr a = f.malloc(1000);  // works again once the fault stops
  CHECK(f.backend.peer_can_access(1, a));
}

TEST_CASE("peer access: classic segments need nothing (driver peer access covers cuMemAlloc memory)") {
  AllocFixture f;
  f.malloc(1000);
  CHECK(f.alloc->set_peer_access(1, true) == kSuccess);
  CHECK(f.alloc->set_peer_access(1, false) == kSuccess);
}

TEST_CASE("dma-buf: every live block a range touches is retained after its free") {
  AllocFixture f;
  const DevicePtr a = f.malloc(1000);
  const DevicePtr b = f.malloc(1000);
  const DevicePtr c = f.malloc(1000);
  const DevicePtr d = f.malloc(1000);
  // A page-rounded range over b reaches into a and c, not d.
  CHECK(f.alloc->mark_range_exported(a + 600, c + 10) == 3);
  f.alloc->validate();
  CHECK(query(f, a).exported);
  CHECK(query(f, b).exported);
  CHECK(query(f, c).exported);
  CHECK_FALSE(query(f, d).exported);
  f.free(b);
  for (int i = 0; i < 4; ++i) CHECK(f.malloc(1000) != b);
  (void)d;
}

TEST_CASE("dma-buf: a retained block of an expandable segment stays mapped, out of reuse and of releasable bytes") {
  Config c;
  c.expandable_segments = true;
  AllocFixture f(c, 1 * GiB);
  const DevicePtr a = f.malloc(1000);
  CHECK(f.alloc->mark_range_exported(a, a + 1000) == 1);
  f.free(a);
  CHECK(f.malloc(1000) != a);
  f.empty_cache();
  CHECK(f.backend.live_mappings() == 1);  // the page under a stays
  CHECK(f.alloc->releasable_bytes() == 0);
}
