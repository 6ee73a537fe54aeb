// host_cache.h — a cache of page-locked (pinned) host memory.
//
// Pinning pages is among the driver's most expensive calls (about 1.3 ms
// for 4 KiB and 200 ms for 256 MiB on an H100), and cuMemFreeHost waits for
// the device.  Like PyTorch's CachingHostAllocator, this cache rounds each
// request up to a size class (class_size(): powers of two), keeps one free
// list per class, and never splits a block: a block is one driver
// allocation, so the driver's own answers about it (device alias) stay
// right; its flags are answered by the shim from the flags asked, which a
// block keeps (the driver reports those of the chunk it carved the block
// from: shim/host_ops.cpp).  Unlike PyTorch's it serves any program,
// through the shim.
//
// Pools: a block is reused only for a request with exactly the same flags
// (portable / device-mapped / write-combined) and the same owner (the shim
// passes the current context's state).  Portable blocks too: the portable
// flag says every context may use the memory, not that it outlives the
// context that allocated it — the driver frees a context's pinned memory,
// portable or not, when that context is destroyed.  A block handed to
// another context's request would stay the old context's driver
// allocation, and that context's death would free memory the new holder
// still uses (issue 34, item 4).  So a block serves only its own
// context's requests: whoever holds it, its owner is the context whose
// death frees it.  The cache itself is process-wide, as host memory is;
// every block remembers its owner, whose death (forget_owner) takes its
// blocks along.
//
// Safe reuse: a freed block may still be read or written by an
// asynchronous copy enqueued on any stream.  It waits (`waiting`) until a
// fence recorded after the free completes (`fenced`, then `free`).  Fences
// are recorded lazily, one for every block waiting, when a request misses
// its class while a block of that pool waits: no driver call on the free
// path, never a device synchronization.
//
// Limit: the bytes cached (free, waiting or fenced) stay at most
// max_cached_bytes.  A free that would pass it first releases idle free
// blocks (recording a fence for waiting ones, which may make some idle);
// if that is not enough, the block goes back to the driver at once
// (cuMemFreeHost then waits for the copies, as without the cache).
// A limit of 0 caches nothing.
//
// Thread safety: one mutex; driver allocations and releases happen outside
// it.  validate() checks every invariant (host_cache_check.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "host_backend.h"
#include "stats.h"

namespace cachalloc {

// cuMemHostAlloc's flags; any other bit goes to the driver uncached.
inline constexpr unsigned kHostAllocPortable = 0x01;
inline constexpr unsigned kHostAllocDeviceMap = 0x02;
inline constexpr unsigned kHostAllocWriteCombined = 0x04;
inline constexpr unsigned kHostAllocFlagMask = 0x07;

// One counter in PyTorch's host_memory_stats() shape: the device
// statistics' own Stat (current, peak, allocated, freed).
using HostStat = Stat;

struct HostStats {
  HostStat allocations;      // blocks the program holds
  HostStat segments;         // driver allocations the cache holds
  HostStat allocated_bytes;  // class bytes of the blocks the program holds
  HostStat requested_bytes;  // bytes the program asked for
  HostStat reserved_bytes;   // class bytes of every segment
  std::int64_t cached_bytes = 0;    // free + waiting + fenced
  std::int64_t waiting_bytes = 0;   // freed, not yet known safe
  std::uint64_t num_host_alloc = 0, num_host_free = 0;  // driver calls
  std::uint64_t host_alloc_time_ns = 0, host_free_time_ns = 0;
  std::uint64_t max_host_alloc_time_ns = 0, max_host_free_time_ns = 0;
  std::uint64_t num_cache_hits = 0;       // served without a driver allocation
  std::uint64_t num_fences = 0;           // fences recorded
  std::uint64_t num_over_limit_frees = 0; // frees handed to the driver by the limit
  std::uint64_t num_oom_retries = 0;      // driver allocations retried after emptying the cache
  std::uint64_t num_forgotten = 0;        // blocks dropped with their owner's context
};

// The statistics as flat "name":value pairs, named as PyTorch's
// torch.cuda.host_memory_stats() names them where it has the counter
// ("allocated.current", "segment.peak", "host_alloc_time.total" in µs, ...),
// then cachalloc's own (cached_bytes, num_cache_hits, num_fences, ...).
std::vector<std::pair<std::string, std::int64_t>> flatten_host_stats(const HostStats& s);

// What the cache knows about an address inside one of its blocks.
struct HostBlockInfo {
  void* base = nullptr;
  std::size_t requested = 0;  // what the program asked for
  std::size_t size = 0;       // the class size (the driver allocation)
  unsigned flags = 0;
  std::uintptr_t owner = 0;
  std::uint64_t serial = 0;   // unique per allocation served
  bool live = false;          // held by the program (else cached)
};

class HostCache {
 public:
  HostCache(HostBackend* backend, std::size_t max_cached_bytes);
  ~HostCache();
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  // The size class of a request: the next power of two, at least a page.
  // The one place the class policy lives.
  static std::size_t class_size(std::size_t size);

  // `owner` keys every block (the shim: the current context): only its
  // requests reuse its blocks, portable or not (see "Pools" above).
  // Returns the driver's status on failure.
  Status allocate(std::size_t size, unsigned flags, std::uintptr_t owner, void** out);
  // kNotOwned: `ptr` is in no block (the caller asks the driver);
  // kInvalidValue: inside a block but not a live block's start (a double
  // free or an interior pointer), what the driver answers.
  Status free(void* ptr);
  // Any address inside a block, live or cached.
  bool lookup(const void* ptr, HostBlockInfo* info) const;
  bool owns(const void* ptr) const { return lookup(ptr, nullptr); }

  // Records a fence for every waiting block and returns completed ones to
  // their pools (control API, tests).
  void reclaim();
  // Waits for every fence and releases every free block to the driver.
  void empty_cache();
  // The owner died (its context was destroyed, and the driver freed the
  // memory allocated in it): its blocks, live or cached, leave the cache
  // without a driver call.  A later free of a live one goes to the driver.
  void forget_owner(std::uintptr_t owner);

  HostStats stats() const;
  void reset_peak_stats();
  std::size_t max_cached_bytes() const { return max_cached_; }
  // "" when every invariant holds, else the first one broken.
  std::string validate() const;

 private:
  enum class State : std::uint8_t { live, waiting, fenced, free };
  static constexpr int kClasses = 64;
  struct Pool;
  struct Block {
    std::uintptr_t base = 0;
    std::size_t size = 0, requested = 0;
    unsigned flags = 0;
    std::uintptr_t owner = 0;
    std::uint64_t serial = 0;
    State state = State::live;
    Pool* pool = nullptr;
    int klass = 0;
  };
  struct Pool {
    std::array<std::vector<Block*>, kClasses> free;  // LIFO: the warmest block first
    std::array<int, kClasses> waiting{};             // blocks waiting, not yet behind a fence
  };
  struct PoolKey {
    unsigned flags;
    std::uintptr_t owner;
    auto operator<=>(const PoolKey&) const = default;
  };
  struct FenceBatch {
    FenceId fence;
    std::vector<Block*> blocks;
  };

  static int class_index(std::size_t class_bytes);
  Pool& pool_for(unsigned flags, std::uintptr_t owner);
  Block* take_free(Pool& pool, int klass);
  bool issue_fence();
  bool poll_fences();
  void retire_front_fence();
  void mark_free(Block* b);
  void take_out_for_release(Block* b, std::vector<void*>* release);
  bool trim_for(std::size_t bytes, std::vector<void*>* release);
  template <typename Fits>
  void release_free_until(Fits&& fits, std::vector<void*>* release);
  void release_all(const std::vector<void*>& ptrs);
  Status driver_alloc(std::size_t size, unsigned flags, void** out);
  void note_served(Block* b, std::size_t requested);

  HostBackend* backend_;
  const std::size_t max_cached_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Block*> blocks_;  // by base: every segment held
  std::map<PoolKey, Pool> pools_;
  std::vector<Block*> waiting_;
  std::deque<FenceBatch> fences_;
  std::uint64_t next_serial_ = 1;
  HostStats stats_;
};

}  // namespace cachalloc
