// test_pause_backup.cpp — the host buffer of a paused tag's backup on the
// fake backend: given back at the resume unless the tag retains it, the
// retained backup's lookup (backup_pointer) and reuse, pageable (mmap'ed)
// backups, and failures injected at every call with pageable backups.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "pause_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

// Whether [p, p+n) is mapped in this process (msync answers ENOMEM for an
// unmapped range): a pageable backup given back is unmapped, not cached.
bool host_mapped(const void* p, std::size_t n) {
  auto* page = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{4095});
  return ::msync(page, n, MS_ASYNC) == 0 || errno != ENOMEM;
}

void* backup_of(PauseFixture& f, DevicePtr p, std::size_t n) {
  void* host = reinterpret_cast<void*>(1);
  REQUIRE(f.alloc->backup_pointer(p, n, &host) == kSuccess);
  return host;
}

bool host_holds(const void* host, std::size_t n, unsigned seed) {
  const auto t = PauseFixture::period(seed);
  for (std::size_t i = 0; i < n; i += t.size())
    if (std::memcmp(static_cast<const unsigned char*>(host) + i, t.data(), std::min(t.size(), n - i)) != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("host backup: the resume gives the host buffer back (the tag does not retain it)") {
  for (BackupMode mode : {BackupMode::host, BackupMode::pageable}) {
    PauseFixture f;
    f.alloc->set_tag_backup(kWeights, mode);
    const DevicePtr w = f.tmalloc(30 * MiB, kWeights);
    f.fill(w, 30 * MiB, 1);
    REQUIRE(f.pause(kWeights) == kSuccess);
    CHECK(f.tag(kWeights).backup_capacity == 30 * MiB);
    CHECK(f.backend.live_host() == (mode == BackupMode::host ? 1 : 0));
    CHECK(f.backend.live_pageable() == (mode == BackupMode::pageable ? 1u : 0u));
    void* host = backup_of(f, w, 30 * MiB);
    REQUIRE(host != nullptr);
    CHECK(host_holds(host, 30 * MiB, 1));
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(f.holds(w, 30 * MiB, 1));
    CHECK(f.tag(kWeights).backup_capacity == 0);
    CHECK(f.backend.live_host() == 0);
    CHECK(f.backend.live_pageable() == 0);
    if (mode == BackupMode::pageable) CHECK_FALSE(host_mapped(host, 30 * MiB));  // unmapped: resident memory drops
    CHECK(backup_of(f, w, 16) == nullptr);
    // The next pause takes a new buffer and restores from it.
    f.fill(w, 30 * MiB, 2);
    REQUIRE(f.pause(kWeights) == kSuccess);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(f.holds(w, 30 * MiB, 2));
    CHECK(f.backend.live_host() == 0);
    CHECK(f.backend.live_pageable() == 0);
    f.free(w);
  }
}

TEST_CASE("retain: the host backup outlives the resume, at the same address, refilled by the next pause") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, BackupMode::host);
  const DevicePtr a = f.tmalloc(3000, kWeights);
  const DevicePtr b = f.tmalloc(5 * MiB, kWeights);
  f.fill(a, 3000, 1);
  f.fill(b, 5 * MiB, 2);
  REQUIRE(f.pause(kWeights) == kSuccess);
  void* first = backup_of(f, b + 100, 1000);
  REQUIRE(first != nullptr);
  CHECK(backup_of(f, a, 3000) != nullptr);
  f.alloc->set_tag_retain_backup(kWeights, true);  // read at the resume, as torch_memory_saver's flag
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(backup_of(f, b + 100, 1000) == first);
  CHECK(host_holds(static_cast<unsigned char*>(first) - 100, 5 * MiB, 2));
  CHECK(f.tag(kWeights).retained_bytes >= 5 * MiB + 3000);
  CHECK(f.tag(kWeights).retain);
  CHECK(f.backend.live_host() == 1);
  f.alloc->set_tag_retain_backup(kWeights, false);  // the backup held now stays until the next resume
  CHECK(backup_of(f, b + 100, 1000) == first);
  f.fill(b, 5 * MiB, 3);  // the device moves on; the next pause refills the same buffer
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(backup_of(f, b + 100, 1000) == first);
  CHECK(host_holds(static_cast<unsigned char*>(first) - 100, 5 * MiB, 3));
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(b, 5 * MiB, 3));
  CHECK(backup_of(f, b + 100, 1000) == nullptr);  // not retained this time: given back
  CHECK(f.backend.live_host() == 0);
  CHECK(f.tag(kWeights).retained_bytes == 0);
  for (DevicePtr p : {a, b}) f.free(p);
}

TEST_CASE("retain: a retained backup answers only for the allocations it copied, and goes with the last of them") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, BackupMode::pageable);
  f.alloc->set_tag_retain_backup(kWeights, true);
  const DevicePtr a = f.tmalloc(4 * MiB, kWeights);
  const DevicePtr b = f.tmalloc(4 * MiB, kWeights);
  f.fill(a, 4 * MiB, 4);
  REQUIRE(f.pause(kWeights) == kSuccess);
  REQUIRE(f.resume(kWeights) == kSuccess);
  REQUIRE(backup_of(f, a, 4 * MiB) != nullptr);
  f.free(a);
  CHECK(f.backend.live_pageable() == 1);  // b still has its copy
  CHECK(backup_of(f, b, 16) != nullptr);
  const DevicePtr again = f.tmalloc(4 * MiB, kWeights);  // a's address, another allocation
  REQUIRE(again == a);
  CHECK(backup_of(f, again, 16) == nullptr);
  f.free(b);  // the last block it copied: the buffer goes (unmapped)
  CHECK(f.backend.live_pageable() == 0);
  CHECK(f.tag(kWeights).backup_capacity == 0);
  CHECK(f.tag(kWeights).retained_bytes == 0);
  f.free(again);
}

TEST_CASE("pause: freeing every backed-up block of a paused tag gives its backup back at once") {
  for (BackupMode mode : {BackupMode::host, BackupMode::disk}) {
    TempDir dir;
    Config c;
    c.pause_backup_dir = dir.path;
    PauseFixture f(c);
    f.alloc->set_tag_backup(kWeights, mode);
    const DevicePtr a = f.tmalloc(6 * MiB, kWeights);
    const DevicePtr b = f.tmalloc(3000, kWeights);
    REQUIRE(f.pause(kWeights) == kSuccess);
    f.free(a);
    f.alloc->validate();
    CHECK(f.tag(kWeights).backup_bytes > 0);  // b's copy is still needed
    f.free(b);
    f.alloc->validate();
    CHECK(f.tag(kWeights).backup_bytes == 0);
    CHECK(f.backend.live_host() == (mode == BackupMode::disk ? 1 : 0));  // (the disk staging stays)
    CHECK(f.backend.open_files() == 0);
    CHECK(f.alloc->tag_paused(kWeights));
    REQUIRE(f.resume(kWeights) == kSuccess);  // nothing to restore, nothing mapped
    const DevicePtr again = f.tmalloc(6 * MiB, kWeights);
    f.free(again);
  }
}

TEST_CASE("retain: a pause without a backup drops the retained one") {
  PauseFixture f;
  f.alloc->set_tag_backup(kWeights, BackupMode::host);
  f.alloc->set_tag_retain_backup(kWeights, true);
  const DevicePtr a = f.tmalloc(4 * MiB, kWeights);
  REQUIRE(f.pause(kWeights) == kSuccess);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.backend.live_host() == 1);
  f.alloc->set_tag_backup(kWeights, BackupMode::none);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(backup_of(f, a, 16) == nullptr);  // its contents are not what the tag held at this pause
  CHECK(f.backend.live_host() == 0);
  REQUIRE(f.resume(kWeights) == kSuccess);
  f.free(a);
}

TEST_CASE("backup_pointer: what it answers outside a held host backup") {
  TempDir dir;
  Config c;
  c.pause_backup_dir = dir.path;
  PauseFixture f(c);
  const DevicePtr u = f.malloc(1 * MiB);
  const DevicePtr k = f.tmalloc(2 * MiB, kKv);
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(2 * MiB, kWeights);
  CHECK(backup_of(f, u, 16) == nullptr);  // untagged
  CHECK(backup_of(f, k, 16) == nullptr);  // running
  REQUIRE(f.pause(kKv) == kSuccess);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(backup_of(f, k, 16) == nullptr);  // paused without a backup
  CHECK(backup_of(f, w, 16) == nullptr);  // a disk backup has no host copy
  void* host = nullptr;
  CHECK(f.alloc->backup_pointer(w + 2 * MiB - 8, 16, &host) == kInvalidValue);  // past the block
  CHECK(f.alloc->backup_pointer(1, 16, &host) == kNotOwned);
  REQUIRE(f.resume(kKv) == kSuccess);
  REQUIRE(f.resume(kWeights) == kSuccess);
  for (DevicePtr p : {u, k, w}) f.free(p);
}

TEST_CASE("pause (pageable backup): a failure at any call loses nothing and leaks nothing") {
  int n = 0;
  while (run_with_fault(n, false, BackupMode::pageable)) ++n;
  CHECK(n > 10);
}

TEST_CASE("resume (pageable backup): a failure at any call loses nothing and leaks nothing") {
  int n = 0;
  while (run_with_fault(n, true, BackupMode::pageable)) ++n;
  CHECK(n > 10);
}
