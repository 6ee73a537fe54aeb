// stats.h — DeviceStats, field for field as PyTorch's
// c10::CachingDeviceAllocator::DeviceStats, so that numbers read from a
// cachalloc dump compare directly with torch.cuda.memory_stats().
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace cachalloc {

// The one way a statistic `s` (with fields current, allocated and peak)
// rises by `amount`: its current level and its cumulative increases move,
// and the peak follows the current level.  Stat below, AllocatorStats'
// PoolStats (allocator_stats.h) and the thread caches' ThreadDelta
// (thread_cache.h) all count through it.  It takes the statistic, not its
// three fields: the compiler then knows they are distinct fields of one
// object and keeps other loads in registers around it (with three
// references it reloaded a block's size in malloc_miss, +1 instruction per
// large pair in bench/callgrind-pair.sh).
template <class S>
inline void count_increase(S& s, std::int64_t amount) {
  s.current += amount;
  s.allocated += amount;
  if (s.current > s.peak) s.peak = s.current;
}

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // cumulative increases
  std::int64_t freed = 0;      // cumulative decreases

  void increase(std::int64_t amount) { count_increase(*this, amount); }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = 0; freed = 0; }
};

// Index into a StatArray, named as torch.cuda.memory_stats() names them.
enum class StatType : int { aggregate = 0, small_pool = 1, large_pool = 2 };
inline constexpr int kNumStatTypes = 3;
const char* stat_type_name(StatType t);  // "all", "small_pool", "large_pool"

struct StatArray {
  std::array<Stat, kNumStatTypes> a{};
  Stat& operator[](StatType t) { return a[static_cast<int>(t)]; }
  const Stat& operator[](StatType t) const { return a[static_cast<int>(t)]; }
  // Updates the aggregate and the pool's own entry together.
  void increase(bool small, std::int64_t amount) {
    a[0].increase(amount);
    a[small ? 1 : 2].increase(amount);
  }
  void decrease(bool small, std::int64_t amount) {
    a[0].decrease(amount);
    a[small ? 1 : 2].decrease(amount);
  }
};

// The statistics DeviceStats and AllocatorStats (core/allocator_stats.h)
// keep alike, under the same names: plain counters and single Stats.  One
// struct for both, so that a statistic added here is copied by
// AllocatorStats::get() and reset by both reset_accumulated()s.
struct SharedStats {
  std::int64_t num_alloc_retries = 0;  // device allocations that failed and were retried after a cache flush
  std::int64_t num_ooms = 0;           // allocations that finally failed
  Stat oversize_allocations;           // allocations >= max_split_size
  Stat oversize_segments;              // segments >= max_split_size
  std::int64_t num_sync_all_streams = 0;  // synchronizations of every pending event
  std::int64_t num_device_alloc = 0;      // device allocation calls (segment_alloc / vm_create)
  std::int64_t num_device_free = 0;       // device free calls
  std::int64_t max_split_size = 0;        // configured max_split_size, bytes

  // Not in PyTorch: frees with no stream that waited for a fence
  // (CachingAllocator::free_deferred), the fences recorded for them and the
  // driver events those took, the streams they found idle by asking (and so
  // recorded nothing on), and the bytes waiting (the memory the fences hold
  // back; its peak is what batching costs).
  std::int64_t num_deferred_frees = 0;
  std::int64_t num_fences = 0;
  std::int64_t num_fence_events = 0;
  std::int64_t num_fence_stream_queries = 0;
  std::int64_t num_fence_waits = 0;  // misses that waited for a fence instead of growing
  std::int64_t num_fence_joins = 0;  // misses that ordered later work after the fences instead of growing
  // Grows that gave free runs back first not to pass the mapped high-water
  // mark (release_before_peak), and the bytes they unmapped.
  std::int64_t num_peak_releases = 0;
  std::int64_t peak_release_bytes = 0;
  // Of those, the grows that mapped the free runs again at the grow's
  // address behind a joined fence (release_remap), and the bytes moved.
  std::int64_t num_peak_remaps = 0;
  std::int64_t peak_remap_bytes = 0;
  // Per-thread front caches (core/thread_cache.h): allocations their hit
  // could not serve that took the allocator's lock (malloc_cached_slow), and
  // polls of a thread's oldest fence that found it not yet complete.  What
  // keeps threads from scaling, where they do not.
  std::int64_t num_thread_cache_locked_allocs = 0;
  std::int64_t num_thread_fence_polls_not_ready = 0;
  // Misses served by a block another stream had freed, the requesting
  // stream made to wait on the device for that stream's work instead of
  // the cache growing (core/steal_path.cpp, cross_stream_reuse).
  std::int64_t num_cross_stream_reuses = 0;
  // Of those, the ones that needed no wait: the device had already run the
  // donor stream past the block's free (a donor mark seen complete).
  std::int64_t num_idle_cross_stream_reuses = 0;
  // Of the others, the ones that waited for a pending mark of the donor
  // recorded after the block's free (its work up to that record), not for
  // all its work so far.
  std::int64_t num_marked_cross_stream_reuses = 0;
  Stat deferred_free_bytes;
  // Bytes the program freed that graph captures still hold (ledger_owners.cpp):
  // counted as allocated too, since the graphs still use them.
  Stat capture_held_bytes;

  // fn on each Stat above.
  template <class Fn>
  void for_each_shared_stat(Fn fn) {
    fn(oversize_allocations);
    fn(oversize_segments);
    fn(deferred_free_bytes);
    fn(capture_held_bytes);
  }
  // Zeroes every counter (a counter added above is zeroed too), keeping
  // max_split_size (a setting) and the Stats (whose accumulated counts
  // for_each_shared_stat resets).
  void reset_counters() {
    SharedStats fresh;
    fresh.max_split_size = max_split_size;
    fresh.oversize_allocations = oversize_allocations;
    fresh.oversize_segments = oversize_segments;
    fresh.deferred_free_bytes = deferred_free_bytes;
    fresh.capture_held_bytes = capture_held_bytes;
    *this = fresh;
  }
};

struct DeviceStats : SharedStats {
  StatArray allocation;            // COUNT: allocations requested by clients
  StatArray segment;               // COUNT: segments obtained from the device
  StatArray active;                // COUNT: active (allocated or awaiting events) blocks
  StatArray inactive_split;        // COUNT: free blocks inside split segments
  StatArray allocated_bytes;       // SUM: bytes handed to clients
  StatArray reserved_bytes;        // SUM: bytes in segments
  StatArray active_bytes;          // SUM: bytes in active blocks
  StatArray inactive_split_bytes;  // SUM: bytes in inactive split blocks
  StatArray requested_bytes;       // SUM: bytes clients asked for (before rounding)

  void reset_peak();
  void reset_accumulated();
};

// One (key, value) per scalar, named exactly as torch.cuda.memory_stats()
// names them ("allocated_bytes.all.current", "num_ooms", ...), in a stable
// order.  Dumps and the reader script use these names.
std::vector<std::pair<std::string, std::int64_t>> flatten_stats(const DeviceStats& s);

}  // namespace cachalloc
