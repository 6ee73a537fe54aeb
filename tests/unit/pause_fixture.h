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

}  // namespace cachalloc::testing
