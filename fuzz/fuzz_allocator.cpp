// fuzz_allocator.cpp — random operation sequences against CachingAllocator
// on the fault-injecting FakeBackend (tests/fake/fake_backend.h).
//
// The input picks a configuration (classic or expandable segments, split
// and rounding limits, GC, a memory fraction, the device's size), then a
// sequence of operations: malloc of any size (zero and huge included),
// free / free_fenced / record_stream of live and of bogus pointers,
// empty_cache, retire_stream, peer access, IPC and dma-buf exports, address
// queries, events completing, and injected failures of segment allocations,
// event records and access changes.  After every step validate() checks the
// allocator's invariants (an InvariantError is uncaught: a crash) and the
// statistics are compared with a model of what is live.  FakeBackend throws
// on a misuse of the device (freeing an unknown segment, mapping over a
// mapping, ...), which is a crash too.  At the end everything is freed and
// the cache emptied: the device must be back to zero.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <vector>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "fuzz_check.h"

using namespace cachalloc;
using cachalloc::testing::FakeBackend;

namespace {

// FUZZ_TRACE=1 prints every operation (to read a crashing input's story).
const bool g_trace = std::getenv("FUZZ_TRACE") != nullptr;
#define TRACE(...) \
  do {                                       \
    if (g_trace) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

constexpr StreamId kStreams[] = {0, 0x11, 0x22, 0x33, 0x44};

struct Live {
  std::size_t size;
  std::uint64_t id;
};

StreamId pick_stream(FuzzedDataProvider& in) { return in.PickValueInArray(kStreams); }

std::size_t pick_size(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 8)) {
    case 0: return 0;
    case 1: return in.ConsumeIntegralInRange<std::size_t>(1, 4096);
    case 2: return in.ConsumeIntegralInRange<std::size_t>(1, 1 * MiB);
    case 3: return in.ConsumeIntegralInRange<std::size_t>(1 * MiB, 64 * MiB);
    case 4: return in.ConsumeIntegralInRange<std::size_t>(1, 2 * GiB);
    case 5:  // sizes at the edges of the size classes
      return in.PickValueInArray<std::size_t>({1, 511, 512, 513, 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 2 * MiB,
                                               10 * MiB - 1, 10 * MiB, 10 * MiB + 1, 20 * MiB, 20 * MiB + 1,
                                               2 * MiB * 1024});
    case 6: return std::numeric_limits<std::size_t>::max() - in.ConsumeIntegralInRange<std::size_t>(0, 64 * MiB);
    case 7: return std::size_t{1} << in.ConsumeIntegralInRange<int>(20, 63);
    default: return in.ConsumeIntegral<std::size_t>();
  }
}

Config pick_config(FuzzedDataProvider& in) {
  Config c;
  c.expandable_segments = in.ConsumeBool();
  if (in.ConsumeBool()) c.max_split_size = in.ConsumeIntegralInRange<std::size_t>(20, 256) * MiB;
  if (in.ConsumeBool()) c.max_non_split_rounding = in.ConsumeIntegralInRange<std::size_t>(1, 64) * MiB;
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: break;
    case 1: c.roundup_power2_divisions.fill(std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 6)); break;
    default:
      for (auto& d : c.roundup_power2_divisions)
        d = in.ConsumeBool() ? 0 : std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 6);
  }
  if (in.ConsumeBool()) c.garbage_collection_threshold = in.ConsumeIntegralInRange<int>(1, 99) / 100.0;
  if (in.ConsumeBool()) c.per_process_memory_fraction = in.ConsumeIntegralInRange<int>(1, 100) / 100.0;
  return c;
}

class Run {
 public:
  Run(const Config& config, std::size_t device_bytes)
      : backend_(device_bytes), alloc_(&backend_, config), expandable_(config.expandable_segments) {}

  void step(FuzzedDataProvider& in) {
    const int op = in.ConsumeIntegralInRange<int>(0, 19);
    TRACE("op %d\n", op);
    switch (op) {
      case 0: case 1: case 2: do_malloc(pick_size(in), pick_stream(in)); break;
      case 3: case 4: if (DevicePtr p = pick_live(in)) do_free(p); break;
      case 5: if (DevicePtr p = pick_live(in)) do_free_fenced(p, in); break;
      case 6:
        if (DevicePtr p = pick_live(in)) {
          const StreamId s = pick_stream(in);
          TRACE("  record_stream(%#lx, %#lx)\n", static_cast<unsigned long>(p), static_cast<unsigned long>(s));
          FUZZ_CHECK(alloc_.record_stream(p, s) == kSuccess);
        }
        break;
      case 7: free_bogus(pick_bogus(in)); break;
      case 8: record_bogus(pick_bogus(in), pick_stream(in)); break;
      case 9: TRACE("  empty_cache\n"); alloc_.empty_cache(); break;
      case 10:
        if (in.ConsumeBool()) {
          const StreamId s = pick_stream(in);
          TRACE("  complete events on %#lx\n", static_cast<unsigned long>(s));
          backend_.complete_events_on(s);
        } else {
          TRACE("  complete all events\n");
          backend_.complete_all_events();
        }
        break;
      case 11: {
        const bool on = in.ConsumeBool();
        TRACE("  auto-complete %d\n", on);
        backend_.set_auto_complete(on);
        break;
      }
      case 12: {
        const int n = in.ConsumeIntegralInRange<int>(0, 4);
        TRACE("  fail next %d allocs\n", n);
        backend_.fail_next_allocs(n);
        break;
      }
      case 13: {
        const int n = in.ConsumeIntegralInRange<int>(0, 4), after = in.ConsumeIntegralInRange<int>(0, 4);
        TRACE("  fail %d event records after %d\n", n, after);
        backend_.fail_next_records(n, after);
        break;
      }
      case 14: {
        const int n = in.ConsumeIntegralInRange<int>(0, 4);
        TRACE("  fail next %d access changes\n", n);
        backend_.fail_next_access(n);
        break;
      }
      case 15: {
        const Status st = alloc_.set_peer_access(in.ConsumeIntegralInRange<int>(1, 3), in.ConsumeBool());
        FUZZ_CHECK(st == kSuccess || st == kInvalidValue);
        break;
      }
      case 16: do_export(in); break;
      case 17: do_query(in); break;
      case 18: {
        const StreamId s = pick_stream(in);
        TRACE("  retire_stream(%#lx)\n", static_cast<unsigned long>(s));
        FUZZ_CHECK(alloc_.retire_stream(s) == kSuccess);
        break;
      }
      default: misc(in);
    }
    check();
  }

  // Everything freed, the cache emptied: nothing may stay on the device.
  void finish() {
    backend_.fail_next_allocs(0);
    backend_.fail_next_records(0);
    backend_.fail_next_access(0);
    while (!live_.empty()) do_free(live_.begin()->first);
    alloc_.empty_cache();
    check();
    const DeviceStats s = alloc_.stats();
    FUZZ_CHECK(s.allocation[StatType::aggregate].current == 0);
    FUZZ_CHECK(s.active[StatType::aggregate].current == 0 || expandable_range_exported_);
    // Retained blocks of expandable segments stay mapped until the context dies.
    if (!expandable_range_exported_) {
      FUZZ_CHECK(backend_.used() == 0);
      FUZZ_CHECK(backend_.live_segments() == 0);
      FUZZ_CHECK(backend_.live_mappings() == 0);
      FUZZ_CHECK(s.reserved_bytes[StatType::aggregate].current == 0);
    }
  }

 private:
  void do_malloc(std::size_t size, StreamId stream) {
    DevicePtr p = 0;
    const Status st = alloc_.malloc(&p, size, stream);
    TRACE("  malloc(%zu, stream %#lx) = %d, %#lx\n", size, static_cast<unsigned long>(stream), st,
          static_cast<unsigned long>(p));
    if (size == 0) FUZZ_CHECK(st == kInvalidValue);
    if (st != kSuccess) {
      FUZZ_CHECK(st == kInvalidValue || st == kOutOfMemory);
      return;
    }
    FUZZ_CHECK(p != 0);
    FUZZ_CHECK(p % kMinBlockAlignment == 0);
    FUZZ_CHECK(live_.count(p) == 0);
    // The new block overlaps no live block.
    auto next = live_.upper_bound(p);
    if (next != live_.end()) FUZZ_CHECK(p + size <= next->first);
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      FUZZ_CHECK(prev->first + prev->second.size <= p);
    }
    AddressInfo info;
    FUZZ_CHECK(alloc_.query(p, &info) == kSuccess);
    FUZZ_CHECK(info.live && info.block == p && info.requested == size);
    FUZZ_CHECK(info.segment <= p && p + size <= info.segment + info.segment_size);
    live_[p] = Live{size, info.id};
  }

  void do_free(DevicePtr p) {
    TRACE("  free(%#lx)\n", static_cast<unsigned long>(p));
    FUZZ_CHECK(alloc_.free(p) == kSuccess);
    live_.erase(p);
    remember_freed(p);
  }

  void do_free_fenced(DevicePtr p, FuzzedDataProvider& in) {
    std::vector<StreamId> streams;
    const int n = in.ConsumeIntegralInRange<int>(0, 4);
    for (int i = 0; i < n; ++i) streams.push_back(pick_stream(in));
    TRACE("  free_fenced(%#lx, %d streams)\n", static_cast<unsigned long>(p), n);
    FUZZ_CHECK(alloc_.free_fenced(p, streams) == kSuccess);
    live_.erase(p);
    remember_freed(p);
  }

  void remember_freed(DevicePtr p) {
    if (freed_.size() < 64) freed_.push_back(p);
    else freed_[p / kMinBlockAlignment % freed_.size()] = p;
  }

  DevicePtr pick_live(FuzzedDataProvider& in) {
    if (live_.empty()) return 0;
    auto it = live_.begin();
    std::advance(it, in.ConsumeIntegralInRange<std::size_t>(0, live_.size() - 1));
    return it->first;
  }

  // A pointer that is probably not the start of a live block: freed ones,
  // interior and one-past-the-end pointers, null, anything.
  DevicePtr pick_bogus(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
        if (!freed_.empty()) return freed_[in.ConsumeIntegralInRange<std::size_t>(0, freed_.size() - 1)];
        return 0;
      case 1:
        if (DevicePtr p = pick_live(in)) return p + in.ConsumeIntegralInRange<std::size_t>(1, live_[p].size);
        return 1;
      case 2: return 0;
      case 3:
        if (DevicePtr p = pick_live(in)) return p - in.ConsumeIntegralInRange<std::size_t>(1, 4 * MiB);
        return ~DevicePtr{0};
      default: return in.ConsumeIntegral<DevicePtr>();
    }
  }

  // A pointer that is not a live block start changes nothing and is either
  // not cachalloc's (kNotOwned: the shim passes it on) or refused; freeing
  // null succeeds.
  void free_bogus(DevicePtr p) {
    if (live_.count(p) != 0) return do_free(p);  // it was a live block after all
    const bool owned = alloc_.owns(p);
    const Status st = alloc_.free(p);
    TRACE("  free(bogus %#lx) = %d, owned %d\n", static_cast<unsigned long>(p), st, owned);
    if (p == 0) FUZZ_CHECK(st == kSuccess);  // cuMemFree(0), like free(NULL)
    else FUZZ_CHECK(st == (owned ? kInvalidValue : kNotOwned));
  }

  void record_bogus(DevicePtr p, StreamId stream) {
    if (live_.count(p) != 0) return;
    const bool owned = alloc_.owns(p);
    const Status st = alloc_.record_stream(p, stream);
    TRACE("  record_stream(bogus %#lx) = %d, owned %d\n", static_cast<unsigned long>(p), st, owned);
    FUZZ_CHECK(st == (owned ? kInvalidValue : kNotOwned));
  }

  void do_export(FuzzedDataProvider& in) {
    const DevicePtr p = pick_live(in);
    if (p == 0) return;
    const Live& l = live_[p];
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0: {  // an IPC handle for the block
        AddressInfo info;
        FUZZ_CHECK(alloc_.query(p, &info) == kSuccess);
        const Status st = alloc_.mark_exported(p, l.id);
        FUZZ_CHECK(st == (info.expandable ? kNotSupported : kSuccess));
        break;
      }
      case 1:  // a stale handle: the id of another allocation
        FUZZ_CHECK(alloc_.mark_exported(p, l.id + 1 + in.ConsumeIntegralInRange<std::uint64_t>(0, 3)) ==
                   kInvalidValue);
        break;
      default: {  // a dma-buf of an address range starting in the block
        const DevicePtr lo = p + in.ConsumeIntegralInRange<std::size_t>(0, l.size - 1);
        const DevicePtr hi = lo + in.ConsumeIntegralInRange<std::size_t>(1, 64 * MiB);
        const std::size_t marked = alloc_.mark_range_exported(lo, hi);
        FUZZ_CHECK(marked >= 1);
        if (expandable_) expandable_range_exported_ = true;
      }
    }
  }

  void do_query(FuzzedDataProvider& in) {
    const DevicePtr base = pick_live(in);
    const DevicePtr p = base != 0 && in.ConsumeBool() ? base + in.ConsumeIntegralInRange<std::size_t>(0, live_[base].size)
                                                      : pick_bogus(in);
    AddressInfo info;
    const Status st = alloc_.query(p, &info);
    FUZZ_CHECK(st == (alloc_.owns(p) ? kSuccess : kNotOwned));
    if (st != kSuccess) return;
    FUZZ_CHECK(info.segment <= p && p < info.segment + info.segment_size);
    FUZZ_CHECK(!info.expandable || expandable_);
    // Live exactly when p lies within what some live block asked for.
    auto it = live_.upper_bound(p);
    const bool in_live = it != live_.begin() && p < std::prev(it)->first + std::prev(it)->second.size;
    FUZZ_CHECK(info.live == in_live);
    if (in_live) {
      --it;
      FUZZ_CHECK(info.block == it->first && info.requested == it->second.size && info.id == it->second.id);
    }
  }

  void misc(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: (void)alloc_.snapshot(); break;
      case 1: (void)alloc_.releasable_bytes(); break;
      case 2: alloc_.reset_peak_stats(); break;
      case 3: alloc_.reset_accumulated_stats(); break;
      default: {  // someone else takes (or gives back) device memory
        std::size_t total = 0, free_bytes = 0;
        backend_.mem_info(&free_bytes, &total);
        backend_.set_foreign_usage(in.ConsumeIntegralInRange<std::size_t>(0, total - backend_.used()));
      }
    }
  }

  void check() const {
    alloc_.validate();
    const DeviceStats s = alloc_.stats();
    std::int64_t requested = 0;
    for (const auto& [p, l] : live_) requested += static_cast<std::int64_t>(l.size);
    FUZZ_CHECK(s.allocation[StatType::aggregate].current == static_cast<std::int64_t>(live_.size()));
    FUZZ_CHECK(s.requested_bytes[StatType::aggregate].current == requested);
    FUZZ_CHECK(s.allocated_bytes[StatType::aggregate].current >= requested);
    FUZZ_CHECK(static_cast<std::size_t>(s.reserved_bytes[StatType::aggregate].current) == backend_.used());
  }

  static constexpr std::size_t kMinBlockAlignment = 512;

  FakeBackend backend_;
  CachingAllocator alloc_;
  const bool expandable_;
  bool expandable_range_exported_ = false;
  std::map<DevicePtr, Live> live_;
  std::vector<DevicePtr> freed_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const Config config = pick_config(in);
  const std::size_t device_bytes = in.ConsumeIntegralInRange<std::size_t>(16, 16 * 1024) * MiB;
  Run run(config, device_bytes);
  for (int steps = 0; steps < 2000 && in.remaining_bytes() > 0; ++steps) run.step(in);
  run.finish();
  return 0;
}
