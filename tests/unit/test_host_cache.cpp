// test_host_cache.cpp — the pinned host cache on a scripted host backend.
//
// FakeHost allocates with malloc and counts every call; its fences model
// copies in flight: begin_copy(ptr) marks a copy touching a block as
// running, and a fence recorded while any copy runs completes only after
// finish_copies().  A block handed out again while a copy that was
// enqueued before its free still runs is the bug the cache exists to avoid
// (reuse_while_copy_in_flight counts it).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "host_cache.h"

using namespace cachalloc;

namespace {

class FakeHost final : public HostBackend {
 public:
  // What the test left allocated (live blocks the cache does not return on
  // destruction, as the driver keeps them) goes with the fake.
  ~FakeHost() override {
    for (auto& [p, info] : live) std::free(p);
  }
  Status host_alloc(std::size_t size, unsigned flags, void** out) override {
    ++allocs;
    if (fail_allocs > 0) return --fail_allocs, kOutOfMemory;
    if (bytes + size > capacity) return kOutOfMemory;
    *out = std::aligned_alloc(4096, size);
    bytes += size;
    live[*out] = {size, flags};
    return kSuccess;
  }
  Status host_free(void* p) override {
    ++frees;
    auto it = live.find(p);
    if (it == live.end()) return kInvalidValue;
    // The driver's cuMemFreeHost waits for copies: the cache's own release
    // is always safe, so it finishes them.
    copies.erase(p);
    bytes -= it->second.first;
    live.erase(it);
    std::free(p);
    return kSuccess;
  }
  Status fence_record(FenceId* out) override {
    if (refuse_fences) return kNotReady;
    ++fences_recorded;
    fence_done[next_fence] = copies.empty();  // complete at once when no copy runs
    *out = next_fence++;
    return kSuccess;
  }
  Status fence_query(FenceId f) override { return fence_done.at(f) ? kSuccess : kNotReady; }
  Status fence_synchronize(FenceId f) override {
    finish_copies();
    return fence_query(f);
  }
  void fence_destroy(FenceId f) override { fence_done.erase(f); }

  void begin_copy(void* p) { copies.insert(p); }
  void finish_copies() {
    copies.clear();
    for (auto& [f, done] : fence_done) done = true;
  }
  // The check a test makes on every block the cache hands out.
  bool copy_in_flight(void* p) const { return copies.contains(p); }

  std::map<void*, std::pair<std::size_t, unsigned>> live;
  std::set<void*> copies;
  std::map<FenceId, bool> fence_done;
  FenceId next_fence = 1;
  int allocs = 0, frees = 0, fences_recorded = 0, fail_allocs = 0;
  bool refuse_fences = false;
  std::size_t bytes = 0, capacity = std::size_t{1} << 40;
};

void* alloc(HostCache& c, std::size_t size, unsigned flags = 0, std::uintptr_t owner = 1) {
  void* p = nullptr;
  REQUIRE(c.allocate(size, flags, owner, &p) == kSuccess);
  REQUIRE(p != nullptr);
  return p;
}

void check_valid(const HostCache& c) {
  const std::string v = c.validate();
  INFO(v);
  CHECK(v.empty());
}

}  // namespace

TEST_CASE("class_size: powers of two from one page", "[host]") {
  CHECK(HostCache::class_size(1) == 4096);
  CHECK(HostCache::class_size(4096) == 4096);
  CHECK(HostCache::class_size(4097) == 8192);
  CHECK(HostCache::class_size(5 << 20) == 8 << 20);
  CHECK(HostCache::class_size(std::size_t{1} << 63) == 0);
}

TEST_CASE("a freed block serves the next request of its class without a driver call", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* a = alloc(c, 5000);
  CHECK(h.allocs == 1);
  CHECK(h.live.at(a).first == 8192);
  REQUIRE(c.free(a) == kSuccess);
  CHECK(h.frees == 0);
  void* b = alloc(c, 7000);
  CHECK(b == a);
  CHECK(h.allocs == 1);
  CHECK(c.stats().num_cache_hits == 1);
  void* other = alloc(c, 9000);  // another class
  CHECK(other != a);
  CHECK(h.allocs == 2);
  check_valid(c);
}

TEST_CASE("flags and owners keep pools apart", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* mapped = alloc(c, 4096, kHostAllocDeviceMap);
  REQUIRE(c.free(mapped) == kSuccess);
  void* plain = alloc(c, 4096, 0);
  CHECK(plain != mapped);
  void* wc = alloc(c, 4096, kHostAllocDeviceMap | kHostAllocWriteCombined);
  CHECK(wc != mapped);
  CHECK(h.live.at(wc).second == (kHostAllocDeviceMap | kHostAllocWriteCombined));
  CHECK(alloc(c, 4096, kHostAllocDeviceMap) == mapped);
  CHECK(h.live.at(mapped).second == kHostAllocDeviceMap);

  SECTION("blocks stay with their owner, portable ones too") {
    void* mine = alloc(c, 1 << 20, 0, /*owner=*/7);
    REQUIRE(c.free(mine) == kSuccess);
    CHECK(alloc(c, 1 << 20, 0, 8) != mine);
    CHECK(alloc(c, 1 << 20, 0, 7) == mine);
    // The driver frees a portable block with the context that allocated it,
    // so another owner's request never gets it (issue 34, item 4).
    void* portable = alloc(c, 1 << 21, kHostAllocPortable, 7);
    REQUIRE(c.free(portable) == kSuccess);
    void* other = alloc(c, 1 << 21, kHostAllocPortable, 8);
    CHECK(other != portable);
    CHECK(alloc(c, 1 << 21, kHostAllocPortable, 7) == portable);
    c.forget_owner(7);  // owner 8's block stays
    CHECK_FALSE(c.owns(portable));
    CHECK(c.owns(other));
    CHECK(c.free(other) == kSuccess);
  }
  check_valid(c);
}

TEST_CASE("a block is never reused while a copy enqueued before its free runs", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* a = alloc(c, 1 << 20);
  h.begin_copy(a);  // cudaMemcpyAsync(dev, a, ...) on some stream
  REQUIRE(c.free(a) == kSuccess);
  void* b = alloc(c, 1 << 20);  // the fence recorded now cannot complete yet
  CHECK_FALSE(h.copy_in_flight(b));
  CHECK(b != a);
  CHECK(h.allocs == 2);
  CHECK(h.fences_recorded == 1);
  h.finish_copies();
  void* again = alloc(c, 1 << 20);  // the fence completed: a is safe
  CHECK(again == a);
  CHECK(h.allocs == 2);
  check_valid(c);
}

TEST_CASE("frees make no driver call and no fence; misses fence the batch once", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(alloc(c, 4096));
  for (void* p : ps) REQUIRE(c.free(p) == kSuccess);
  CHECK(h.fences_recorded == 0);
  CHECK(h.frees == 0);
  for (int i = 0; i < 8; ++i) alloc(c, 4096);
  CHECK(h.fences_recorded == 1);
  CHECK(h.allocs == 8);
  check_valid(c);
}

TEST_CASE("no fence can be recorded (a capture): blocks wait, requests grow", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* a = alloc(c, 4096);
  REQUIRE(c.free(a) == kSuccess);
  h.refuse_fences = true;
  CHECK(alloc(c, 4096) != a);
  h.refuse_fences = false;
  CHECK(alloc(c, 4096) == a);
  check_valid(c);
}

TEST_CASE("double free, interior pointers and foreign pointers", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  auto* a = static_cast<char*>(alloc(c, 100));
  CHECK(c.free(a + 1) == kInvalidValue);
  CHECK(c.free(a + 4095) == kInvalidValue);  // past the request, inside the class
  REQUIRE(c.free(a) == kSuccess);
  CHECK(c.free(a) == kInvalidValue);
  int foreign = 0;
  CHECK(c.free(&foreign) == kNotOwned);
  HostBlockInfo info;
  REQUIRE(c.lookup(a + 10, &info));
  CHECK_FALSE(info.live);
  CHECK(info.base == a);
  CHECK_FALSE(c.lookup(&foreign, &info));
  check_valid(c);
}

TEST_CASE("lookup describes the live block: requested size, flags, a new serial per allocation", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* a = alloc(c, 3000, kHostAllocDeviceMap, 5);
  HostBlockInfo info;
  REQUIRE(c.lookup(static_cast<char*>(a) + 2999, &info));
  CHECK(info.live);
  CHECK(info.base == a);
  CHECK(info.requested == 3000);
  CHECK(info.size == 4096);
  CHECK(info.flags == kHostAllocDeviceMap);
  CHECK(info.owner == 5);
  const auto first = info.serial;
  REQUIRE(c.free(a) == kSuccess);
  REQUIRE(alloc(c, 10, kHostAllocDeviceMap, 5) == a);
  REQUIRE(c.lookup(a, &info));
  CHECK(info.requested == 10);
  CHECK(info.serial != first);
}

TEST_CASE("the limit: idle blocks released first, then the freed block itself", "[host]") {
  FakeHost h;
  HostCache c(&h, 3 * 4096);
  std::vector<void*> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(alloc(c, 4096));
  for (int i = 0; i < 3; ++i) h.begin_copy(ps[i]);
  for (int i = 0; i < 3; ++i) REQUIRE(c.free(ps[i]) == kSuccess);
  CHECK(c.stats().cached_bytes == 3 * 4096);
  CHECK(h.frees == 0);
  CHECK(h.fences_recorded == 0);
  // A fourth cached block would pass the limit; the three still have
  // copies in flight (the fence recorded now is not complete), so none is
  // idle: the block goes back.
  REQUIRE(c.free(ps[3]) == kSuccess);
  CHECK(h.fences_recorded == 1);
  CHECK(h.frees == 1);
  CHECK_FALSE(h.live.contains(ps[3]));
  CHECK(c.stats().num_over_limit_frees == 1);
  check_valid(c);

  SECTION("waiting blocks whose copies completed are released instead") {
    h.finish_copies();
    void* p = alloc(c, 4096);  // served by one of the three
    void* q = alloc(c, 8192);
    REQUIRE(c.free(p) == kSuccess);  // back among the waiting: 3 pages cached
    REQUIRE(c.free(q) == kSuccess);  // a fence at the free makes two idle, released
    CHECK(h.live.contains(q));
    CHECK(c.stats().cached_bytes == 3 * 4096);
    CHECK(c.stats().num_over_limit_frees == 1);
    check_valid(c);
  }
  SECTION("idle blocks go before a new one is refused") {
    h.finish_copies();
    c.reclaim();  // the three become free
    void* big = alloc(c, 8192);
    REQUIRE(c.free(big) == kSuccess);  // needs two pages released
    CHECK(h.frees == 3);
    CHECK(c.stats().cached_bytes == 3 * 4096);
    CHECK(h.live.contains(big));
    check_valid(c);
  }
  SECTION("limit 0 caches nothing") {
    HostCache off(&h, 0);
    void* p = alloc(off, 4096);
    const int before = h.frees;
    REQUIRE(off.free(p) == kSuccess);
    CHECK(h.frees == before + 1);
    check_valid(off);
  }
}

TEST_CASE("the limit: waiting blocks get a fence at the free before the freed block is refused", "[host]") {
  FakeHost h;
  HostCache c(&h, 3 * 4096);
  std::vector<void*> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(alloc(c, 4096));
  for (int i = 0; i < 3; ++i) REQUIRE(c.free(ps[i]) == kSuccess);  // waiting, no fence yet
  REQUIRE(c.free(ps[3]) == kSuccess);  // no copy runs: the fence completes at once
  CHECK(h.fences_recorded == 1);
  CHECK(h.frees == 1);
  CHECK(h.live.contains(ps[3]));  // cached; one of the first three went back instead
  CHECK(c.stats().num_over_limit_frees == 0);
  CHECK(c.stats().cached_bytes == 3 * 4096);
  check_valid(c);
}

TEST_CASE("out of memory: the cache is emptied and the request retried", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  h.capacity = 5 * 4096;
  void* a = alloc(c, 4096);
  void* b = alloc(c, 8192);
  REQUIRE(c.free(b) == kSuccess);
  h.begin_copy(b);
  const auto frees = h.frees;
  void* d = alloc(c, 8192 + 1);  // 16 KiB: only fits once b is released
  CHECK(h.live.contains(d));
  CHECK(h.frees == frees + 1);  // b went back to the driver (its address may come back as d's)
  CHECK((d == b || !h.live.contains(b)));
  CHECK(c.stats().num_oom_retries == 1);
  h.capacity = 0;
  void* e = nullptr;
  CHECK(c.allocate(4096, 0, 1, &e) == kOutOfMemory);
  (void)a;
  check_valid(c);
}

TEST_CASE("an owner's death takes its blocks, live and cached, without a driver call", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* live = alloc(c, 4096, 0, 7);
  void* waiting = alloc(c, 8192, kHostAllocPortable, 7);
  void* fenced = alloc(c, 16384, 0, 7);
  void* idle = alloc(c, 32768, 0, 7);
  void* other = alloc(c, 4096, 0, 8);
  REQUIRE(c.free(idle) == kSuccess);
  c.reclaim();  // idle: free
  REQUIRE(c.free(fenced) == kSuccess);
  h.begin_copy(fenced);
  c.reclaim();  // fenced: behind a fence that cannot complete
  REQUIRE(c.free(waiting) == kSuccess);
  check_valid(c);
  c.forget_owner(7);
  check_valid(c);
  CHECK(h.frees == 0);
  for (void* p : {live, waiting, fenced, idle}) CHECK_FALSE(c.owns(p));
  CHECK(c.owns(other));
  CHECK(c.free(live) == kNotOwned);  // the driver answers for it now
  const HostStats s = c.stats();
  CHECK(s.num_forgotten == 4);
  CHECK(s.segments.current == 1);
  CHECK(s.allocations.current == 1);
  CHECK(s.cached_bytes == 0);
  CHECK(s.waiting_bytes == 0);
  h.finish_copies();
  void* p = alloc(c, 8192, kHostAllocPortable, 8);  // no forgotten block comes back
  CHECK(p != waiting);
  check_valid(c);
}

TEST_CASE("statistics follow PyTorch's host_memory_stats", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* a = alloc(c, 1000);
  void* b = alloc(c, 5000);
  HostStats s = c.stats();
  CHECK(s.allocations.current == 2);
  CHECK(s.segments.current == 2);
  CHECK(s.allocated_bytes.current == 4096 + 8192);
  CHECK(s.requested_bytes.current == 6000);
  CHECK(s.reserved_bytes.current == 4096 + 8192);
  CHECK(s.num_host_alloc == 2);
  REQUIRE(c.free(a) == kSuccess);
  REQUIRE(c.free(b) == kSuccess);
  s = c.stats();
  CHECK(s.allocations.current == 0);
  CHECK(s.allocations.peak == 2);
  CHECK(s.allocations.freed == 2);
  CHECK(s.allocated_bytes.peak == 4096 + 8192);
  CHECK(s.reserved_bytes.current == 4096 + 8192);
  CHECK(s.cached_bytes == 4096 + 8192);
  CHECK(s.waiting_bytes == 4096 + 8192);
  c.reset_peak_stats();
  CHECK(c.stats().allocations.peak == 0);
  c.empty_cache();
  s = c.stats();
  CHECK(s.segments.current == 0);
  CHECK(s.reserved_bytes.current == 0);
  CHECK(s.num_host_free == 2);
  CHECK(h.live.empty());
  check_valid(c);
}

// The flat table (stats dumps, cachalloc.host_memory_stats()) names each
// counter with its own value: waiting and cached bytes part once a fence
// completed.
TEST_CASE("the flat statistics table carries each counter under its own name", "[host]") {
  FakeHost h;
  HostCache c(&h, 1 << 30);
  void* a = alloc(c, 1000);
  void* b = alloc(c, 5000);
  REQUIRE(c.free(a) == kSuccess);
  c.reclaim();  // a's fence completes at once (no copy runs): a is free, no longer waiting
  REQUIRE(c.free(b) == kSuccess);
  const HostStats s = c.stats();
  REQUIRE(s.cached_bytes == 4096 + 8192);
  REQUIRE(s.waiting_bytes == 8192);
  std::map<std::string, std::int64_t> flat;
  for (const auto& [name, value] : flatten_host_stats(s)) flat[name] = value;
  CHECK(flat.at("cached_bytes") == 4096 + 8192);
  CHECK(flat.at("waiting_bytes") == 8192);
  CHECK(flat.at("allocated.freed") == 2);
  CHECK(flat.at("reserved_bytes.current") == 4096 + 8192);
  CHECK(flat.at("requested_bytes.allocated") == 6000);
  CHECK(flat.at("num_host_alloc") == 2);
  CHECK(flat.at("num_fences") == 1);
  check_valid(c);
}

TEST_CASE("threads allocating and freeing never share a block", "[host]") {
  FakeHost h;  // its maps are touched only under the cache's lock, or outside by one call at a time
  std::mutex backend_lock;
  struct Locked final : HostBackend {
    FakeHost* h;
    std::mutex* m;
    Status host_alloc(std::size_t s, unsigned f, void** o) override { std::lock_guard l(*m); return h->host_alloc(s, f, o); }
    Status host_free(void* p) override { std::lock_guard l(*m); return h->host_free(p); }
    Status fence_record(FenceId* o) override { std::lock_guard l(*m); return h->fence_record(o); }
    Status fence_query(FenceId f) override { std::lock_guard l(*m); return h->fence_query(f); }
    Status fence_synchronize(FenceId f) override { std::lock_guard l(*m); return h->fence_synchronize(f); }
    void fence_destroy(FenceId f) override { std::lock_guard l(*m); h->fence_destroy(f); }
  } locked;
  locked.h = &h;
  locked.m = &backend_lock;
  HostCache c(&locked, 64 << 10);
  std::mutex owned_lock;
  std::set<void*> owned;
  bool shared = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = nullptr;
        if (c.allocate(std::size_t{1} << (12 + (i + t) % 4), 0, 1, &p) != kSuccess) continue;
        {
          std::lock_guard l(owned_lock);
          shared |= !owned.insert(p).second;
        }
        {
          std::lock_guard l(owned_lock);
          owned.erase(p);
        }
        c.free(p);
      }
    });
  for (auto& th : threads) th.join();
  CHECK_FALSE(shared);
  check_valid(c);
}
