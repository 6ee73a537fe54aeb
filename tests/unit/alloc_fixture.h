// alloc_fixture.h — a CachingAllocator on a FakeBackend, with the invariant
// checker run after every operation (helpers below), as mimalloc's debug
// builds do.
#pragma once

#include <catch2/catch.hpp>

#include <memory>

#include "caching_allocator.h"
#include "fake_backend.h"

namespace cachalloc::testing {

struct AllocFixture {
  explicit AllocFixture(Config cfg = {}, std::size_t device_bytes = 80 * GiB)
      : backend(device_bytes), alloc(std::make_unique<CachingAllocator>(&backend, cfg)) {}

  DevicePtr malloc(std::size_t size, StreamId stream = 0) {
    DevicePtr p = 0;
    const Status st = alloc->malloc(&p, size, stream);
    alloc->validate();
    REQUIRE(st == kSuccess);
    REQUIRE(p != 0);
    return p;
  }
  Status try_malloc(std::size_t size, StreamId stream = 0, DevicePtr* out = nullptr) {
    DevicePtr p = 0;
    const Status st = alloc->malloc(&p, size, stream);
    alloc->validate();
    if (out != nullptr) *out = p;
    return st;
  }
  void free(DevicePtr p) {
    const Status st = alloc->free(p);
    alloc->validate();
    REQUIRE(st == kSuccess);
  }
  Status try_free(DevicePtr p) {
    const Status st = alloc->free(p);
    alloc->validate();
    return st;
  }
  void empty_cache() {
    alloc->empty_cache();
    alloc->validate();
  }
  DeviceStats stats() const { return alloc->stats(); }
  std::int64_t reserved() const { return stats().reserved_bytes[StatType::aggregate].current; }
  std::int64_t allocated() const { return stats().allocated_bytes[StatType::aggregate].current; }

  FakeBackend backend;
  std::unique_ptr<CachingAllocator> alloc;
};

inline Config config_with_max_split(std::size_t mib) {
  Config c;
  c.max_split_size = mib * MiB;
  return c;
}

}  // namespace cachalloc::testing
