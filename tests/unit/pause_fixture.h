// pause_fixture.h — the fixture of the pause tests (test_pause.cpp,
// test_pause_disk.cpp): tagged mallocs, pause/resume with validate() after
// each, and byte patterns written to and compared with the fake's memory.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "alloc_fixture.h"

namespace cachalloc::testing {

// A fresh directory for backup files, removed (with anything in it) at the end.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/cachalloc-test-XXXXXX";
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    for (const std::string& name : names()) ::unlink((path + "/" + name).c_str());
    ::rmdir(path.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.emplace_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }
  // Files visible in the directory.
  std::size_t entries() const { return names().size(); }
  // Descriptors of this process open on a file of the directory (a backup
  // file has no name but still lives there: /proc shows "DIR/#123 (deleted)").
  std::size_t open_here() const {
    std::size_t n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (const dirent* e = ::readdir(d)) {
        char target[4096];
        const std::string link = std::string("/proc/self/fd/") + e->d_name;
        const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        if (std::strncmp(target, (path + "/").c_str(), path.size() + 1) == 0) ++n;
      }
      ::closedir(d);
    }
    return n;
  }
};

constexpr TagId kWeights = 1;
constexpr TagId kKv = 2;

struct PauseFixture : AllocFixture {
  explicit PauseFixture(Config cfg = {}, std::size_t device = 1 * GiB) : AllocFixture(cfg, device) {}

  DevicePtr tmalloc(std::size_t size, TagId tag, StreamId stream = 0) {
    DevicePtr p = 0;
    const Status st = alloc->malloc_tagged(&p, size, stream, tag);
    alloc->validate();
    REQUIRE(st == kSuccess);
    return p;
  }
  Status pause(TagId tag, bool* no_op = nullptr) {
    const Status st = alloc->pause(tag, no_op);
    alloc->validate();
    return st;
  }
  Status resume(TagId tag, bool* no_op = nullptr) {
    const Status st = alloc->resume(tag, no_op);
    alloc->validate();
    return st;
  }
  // Fills [p, p+n) with a pattern that depends on `seed`; check() compares.
  // Byte i of a block holds (i * 31 + seed) & 0xFF: a pattern of period 256,
  // written and compared a period at a time (memcpy / memcmp), because a
  // loop over tens of MiB byte by byte took minutes under ThreadSanitizer.
  static std::array<unsigned char, 256> period(unsigned seed) {
    std::array<unsigned char, 256> t{};
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<unsigned char>((i * 31 + seed) & 0xFF);
    return t;
  }
  void fill(DevicePtr p, std::size_t n, unsigned seed) {
    const auto t = period(seed);
    std::vector<unsigned char> v(n);
    for (std::size_t i = 0; i < n; i += t.size()) std::memcpy(v.data() + i, t.data(), std::min(t.size(), n - i));
    backend.write(p, v.data(), n);
  }
  bool holds(DevicePtr p, std::size_t n, unsigned seed) {
    const auto t = period(seed);
    std::vector<unsigned char> v(n);
    backend.read(p, v.data(), n);
    for (std::size_t i = 0; i < n; i += t.size())
      if (std::memcmp(v.data() + i, t.data(), std::min(t.size(), n - i)) != 0) return false;
    return true;
  }
  TagStats tag(TagId t) const {
    for (const TagStats& s : alloc->tag_stats())
      if (s.tag == t) return s;
    return {};
  }
};

// One scenario of the fault-injection tests: two tags (one backed up, at
// `mode`), live and cached blocks, then pause or resume with the fault at
// backend call n.  Checks the state after the failure, that finishing the
// cycle without faults restores everything, and that nothing leaked.
// Returns whether the fault fired (false: n is past the last call).
// w1_size: the big backed-up block (smaller for disk backups: each run
// writes and reads it through the file).  named_files: disk backups in
// named files, one per block.
inline bool run_with_fault(int n, bool fault_in_resume, BackupMode mode = BackupMode::host,
                           std::size_t w1_size = 30 * MiB, bool named_files = false) {
  TempDir dir;
  Config c;
  c.pause_backup_dir = dir.path;
  c.pause_backup_chunk = 4 * MiB;  // a disk backup of w1 and w2 spans chunks, one shared by both
  PauseFixture f(c);
  f.alloc->set_tag_backup(kWeights, mode);
  if (named_files) f.alloc->set_backup_files(dir.path, true);  // a file per block, opened in turn
  const DevicePtr u = f.malloc(3 * MiB);
  const DevicePtr w1 = f.tmalloc(w1_size, kWeights);
  const DevicePtr w2 = f.tmalloc(3000, kWeights);
  const DevicePtr w3 = f.tmalloc(25 * MiB, kWeights);
  f.free(w3);
  const DevicePtr k = f.tmalloc(40 * MiB, kKv);
  f.fill(u, 3 * MiB, 1);
  f.fill(w1, w1_size, 2);
  f.fill(w2, 3000, 3);
  if (fault_in_resume) {
    REQUIRE(f.pause(kWeights) == kSuccess);
    REQUIRE(f.pause(kKv) == kSuccess);
  }
  f.backend.fail_call_at(n);
  Status st = kSuccess;
  for (TagId t : {kWeights, kKv}) {
    st = fault_in_resume ? f.resume(t) : f.pause(t);  // validate() runs inside
    if (st != kSuccess) break;
  }
  const bool fired = f.backend.fault_fired();
  // (Resume retries an out-of-memory answer once, after releasing the cache:
  // a fault at vm_create may be recovered from.)
  if (fault_in_resume) CHECK((st == kSuccess || fired));
  else CHECK(fired == (st != kSuccess));
  f.backend.fail_call_at(-1);
  if (fault_in_resume && st != kSuccess) {
    // A failed resume leaves the tag paused.
    CHECK((f.alloc->tag_paused(kWeights) || f.alloc->tag_paused(kKv)));
  }
  // Finish the cycle without faults: pause (if needed) then resume both.
  for (TagId t : {kWeights, kKv}) REQUIRE(f.pause(t) == kSuccess);
  CHECK(f.backend.used() == 20 * MiB);  // the untagged segment only
  for (TagId t : {kWeights, kKv}) REQUIRE(f.resume(t) == kSuccess);
  CHECK(f.holds(u, 3 * MiB, 1));
  CHECK(f.holds(w1, w1_size, 2));  // the backup survived the failure
  CHECK(f.holds(w2, 3000, 3));
  for (DevicePtr p : {u, w1, w2, k}) f.free(p);
  f.empty_cache();
  CHECK(f.backend.used() == 0);
  CHECK(f.backend.live_handles() == 0);
  CHECK(f.backend.live_mappings() == 0);
  CHECK(f.backend.open_files() == 0);  // a disk backup's file went at the resume
  f.alloc.reset();
  CHECK(f.backend.live_host() == 0);
  CHECK(f.backend.live_pageable() == 0);
  CHECK(dir.entries() == 0);
  return fired;
}

}  // namespace cachalloc::testing
