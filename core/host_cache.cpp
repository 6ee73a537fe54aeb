// host_cache.cpp — allocation, free and safe reuse of pinned host blocks.
//
// Block states (host_cache.h):
//   live     held by the program
//   waiting  freed; copies enqueued before the free may still touch it
//   fenced   behind a fence recorded after its free (fences_)
//   free     the fence completed: reusable (Pool::free)
// A request that misses its class polls the fences, and — when a block of
// its pool and class waits — records one fence for all waiting blocks and
// polls again, before it asks the driver for a new block.  The fence is
// recorded after the free, so it orders after every copy the program
// enqueued on the block before freeing it.
#include "host_cache.h"

#include <algorithm>
#include <bit>
#include <chrono>

namespace cachalloc {
namespace {

constexpr std::size_t kPage = 4096;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace

HostCache::HostCache(HostBackend* backend, std::size_t max_cached_bytes)
    : backend_(backend), max_cached_(max_cached_bytes) {}

// Blocks are never returned to the driver here: the process may be exiting
// with the driver gone (the shim never destroys its cache).
HostCache::~HostCache() {
  for (auto& [base, b] : blocks_) delete b;
}

std::size_t HostCache::class_size(std::size_t size) {
  if (size <= kPage) return kPage;
  if (size > (std::size_t{1} << 62)) return 0;  // no class: the driver decides
  return std::bit_ceil(size);
}

int HostCache::class_index(std::size_t class_bytes) { return std::bit_width(class_bytes) - 1; }

// Keyed by owner whatever the flags: a portable block handed to another
// context would still die with the context that allocated it (host_cache.h).
HostCache::Pool& HostCache::pool_for(unsigned flags, std::uintptr_t owner) { return pools_[PoolKey{flags, owner}]; }

HostCache::Block* HostCache::take_free(Pool& pool, int klass) {
  auto& list = pool.free[klass];
  if (list.empty()) return nullptr;
  Block* b = list.back();
  list.pop_back();
  return b;
}

void HostCache::note_served(Block* b, std::size_t requested) {
  b->state = State::live;
  b->requested = requested;
  b->serial = next_serial_++;
  stats_.allocations.increase(1);
  stats_.allocated_bytes.increase(static_cast<std::int64_t>(b->size));
  stats_.requested_bytes.increase(static_cast<std::int64_t>(requested));
}

Status HostCache::allocate(std::size_t size, unsigned flags, std::uintptr_t owner, void** out) {
  const std::size_t bytes = class_size(size);
  if (bytes == 0 || (flags & ~kHostAllocFlagMask) != 0) return kInvalidValue;
  const int klass = class_index(bytes);
  {
    std::lock_guard lock(mutex_);
    Pool& pool = pool_for(flags, owner);
    Block* b = take_free(pool, klass);
    if (b == nullptr && !fences_.empty()) {
      poll_fences();
      b = take_free(pool, klass);
    }
    if (b == nullptr && pool.waiting[klass] != 0 && issue_fence()) {
      poll_fences();
      b = take_free(pool, klass);
    }
    if (b != nullptr) {
      stats_.cached_bytes -= static_cast<std::int64_t>(b->size);
      ++stats_.num_cache_hits;
      note_served(b, size);
      *out = reinterpret_cast<void*>(b->base);
      return kSuccess;
    }
  }
  // A miss: a new driver allocation, made outside the lock (it takes
  // milliseconds and the driver's own global lock).
  void* p = nullptr;
  Status st = driver_alloc(bytes, flags, &p);
  if (st == kOutOfMemory) {
    empty_cache();
    std::lock_guard lock(mutex_);
    ++stats_.num_oom_retries;
  }
  if (st == kOutOfMemory) st = driver_alloc(bytes, flags, &p);
  if (st != kSuccess) return st;
  auto* b = new Block{.base = reinterpret_cast<std::uintptr_t>(p), .size = bytes, .flags = flags, .owner = owner};
  std::lock_guard lock(mutex_);
  b->pool = &pool_for(flags, owner);
  b->klass = klass;
  blocks_.emplace(b->base, b);
  stats_.segments.increase(1);
  stats_.reserved_bytes.increase(static_cast<std::int64_t>(bytes));
  note_served(b, size);
  *out = p;
  return kSuccess;
}

Status HostCache::driver_alloc(std::size_t size, unsigned flags, void** out) {
  const std::uint64_t t0 = now_ns();
  const Status st = backend_->host_alloc(size, flags, out);
  const std::uint64_t dt = now_ns() - t0;
  std::lock_guard lock(mutex_);
  ++stats_.num_host_alloc;
  stats_.host_alloc_time_ns += dt;
  stats_.max_host_alloc_time_ns = std::max(stats_.max_host_alloc_time_ns, dt);
  return st;
}

Status HostCache::free(void* ptr) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::vector<void*> release;
  {
    std::lock_guard lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return kNotOwned;
    Block* b = std::prev(it)->second;
    if (p >= b->base + b->size) return kNotOwned;
    if (p != b->base || b->state != State::live) return kInvalidValue;
    stats_.allocations.decrease(1);
    stats_.allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
    stats_.requested_bytes.decrease(static_cast<std::int64_t>(b->requested));
    if (trim_for(b->size, &release)) {
      b->state = State::waiting;
      ++b->pool->waiting[b->klass];
      waiting_.push_back(b);
      stats_.cached_bytes += static_cast<std::int64_t>(b->size);
      stats_.waiting_bytes += static_cast<std::int64_t>(b->size);
    } else {
      // Over the limit with nothing idle to release: the driver takes the
      // block back now and waits for its copies itself.
      ++stats_.num_over_limit_frees;
      b->state = State::free;  // take_out_for_release expects a cached block
      stats_.cached_bytes += static_cast<std::int64_t>(b->size);
      take_out_for_release(b, &release);
    }
  }
  release_all(release);
  return kSuccess;
}

// Makes room for `bytes` more cached bytes under the limit, releasing free
// blocks (largest classes first; completed fences are collected first).
// Never waits for the device.
// False when even releasing every free block would not be enough.
bool HostCache::trim_for(std::size_t bytes, std::vector<void*>* release) {
  auto fits = [&] { return static_cast<std::size_t>(stats_.cached_bytes) + bytes <= max_cached_; };
  if (fits()) return true;
  if (bytes > max_cached_) return false;
  if (!fences_.empty()) poll_fences();
  release_free_until(fits, release);
  // Still over: the blocks waiting for no fence yet (their pools missed
  // nothing since) get one now — an event record, not a wait — and those
  // already safe are released instead of the block being freed.
  if (!fits() && issue_fence()) {
    poll_fences();
    release_free_until(fits, release);
  }
  return fits();
}

template <typename Fits>
void HostCache::release_free_until(Fits&& fits, std::vector<void*>* release) {
  for (int k = kClasses - 1; k >= 0 && !fits(); --k)
    for (auto& [key, pool] : pools_)
      while (!fits() && !pool.free[k].empty()) {
        Block* b = pool.free[k].back();
        pool.free[k].pop_back();
        take_out_for_release(b, release);
      }
}

// A cached free block (already off its free list) leaves the cache; the
// driver call happens later, outside the lock (release_all).
void HostCache::take_out_for_release(Block* b, std::vector<void*>* release) {
  blocks_.erase(b->base);
  stats_.cached_bytes -= static_cast<std::int64_t>(b->size);
  stats_.segments.decrease(1);
  stats_.reserved_bytes.decrease(static_cast<std::int64_t>(b->size));
  release->push_back(reinterpret_cast<void*>(b->base));
  delete b;
}

void HostCache::release_all(const std::vector<void*>& ptrs) {
  for (void* p : ptrs) {
    const std::uint64_t t0 = now_ns();
    backend_->host_free(p);  // an error leaves nothing to undo: the block is gone from the cache
    const std::uint64_t dt = now_ns() - t0;
    std::lock_guard lock(mutex_);
    ++stats_.num_host_free;
    stats_.host_free_time_ns += dt;
    stats_.max_host_free_time_ns = std::max(stats_.max_host_free_time_ns, dt);
  }
}

// Puts every waiting block behind one new fence.  False when none could be
// recorded (a capture is in flight, or the backend failed): they wait on.
bool HostCache::issue_fence() {
  if (waiting_.empty()) return false;
  FenceId fence = 0;
  if (backend_->fence_record(&fence) != kSuccess) return false;
  ++stats_.num_fences;
  for (Block* b : waiting_) {
    b->state = State::fenced;
    --b->pool->waiting[b->klass];
  }
  fences_.push_back({fence, std::move(waiting_)});
  waiting_.clear();
  return true;
}

// Completes fences oldest first; a later fence completes later, so the
// first one not done ends the walk.  An error is not completion: those
// blocks wait until empty_cache() synchronizes the fence.
bool HostCache::poll_fences() {
  bool freed = false;
  while (!fences_.empty() && backend_->fence_query(fences_.front().fence) == kSuccess) {
    retire_front_fence();
    freed = true;
  }
  return freed;
}

void HostCache::retire_front_fence() {
  FenceBatch f = std::move(fences_.front());
  fences_.pop_front();
  backend_->fence_destroy(f.fence);
  for (Block* b : f.blocks) mark_free(b);
}

void HostCache::mark_free(Block* b) {
  b->state = State::free;
  stats_.waiting_bytes -= static_cast<std::int64_t>(b->size);
  b->pool->free[b->klass].push_back(b);
}

void HostCache::reclaim() {
  std::lock_guard lock(mutex_);
  issue_fence();
  poll_fences();
}

// Waiting for a fence is fine here: nobody frees through this path.
void HostCache::empty_cache() {
  std::vector<void*> release;
  {
    std::lock_guard lock(mutex_);
    issue_fence();
    while (!fences_.empty() && backend_->fence_synchronize(fences_.front().fence) == kSuccess)
      retire_front_fence();
    for (auto& [key, pool] : pools_)
      for (auto& list : pool.free) {
        for (Block* b : list) take_out_for_release(b, &release);
        list.clear();
      }
  }
  release_all(release);
}

void HostCache::forget_owner(std::uintptr_t owner) {
  std::lock_guard lock(mutex_);
  auto owned = [owner](const Block* b) { return b->owner == owner; };
  std::erase_if(waiting_, owned);
  for (FenceBatch& f : fences_) std::erase_if(f.blocks, owned);
  for (auto& [key, pool] : pools_)
    for (auto& list : pool.free) std::erase_if(list, owned);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    Block* b = it->second;
    if (!owned(b)) {
      ++it;
      continue;
    }
    const auto bytes = static_cast<std::int64_t>(b->size);
    if (b->state == State::live) {
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(bytes);
      stats_.requested_bytes.decrease(static_cast<std::int64_t>(b->requested));
    } else {
      stats_.cached_bytes -= bytes;
    }
    if (b->state == State::waiting) --b->pool->waiting[b->klass];
    if (b->state == State::waiting || b->state == State::fenced) stats_.waiting_bytes -= bytes;
    stats_.segments.decrease(1);
    stats_.reserved_bytes.decrease(bytes);
    ++stats_.num_forgotten;
    delete b;
    it = blocks_.erase(it);
  }
  // Its pools are empty now, and no request names a dead owner again.
  std::erase_if(pools_, [owner](const auto& kv) { return kv.first.owner == owner; });
}

bool HostCache::lookup(const void* ptr, HostBlockInfo* info) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return false;
  const Block* b = std::prev(it)->second;
  if (p >= b->base + b->size) return false;
  if (info != nullptr)
    *info = HostBlockInfo{.base = reinterpret_cast<void*>(b->base),
                          .requested = b->requested,
                          .size = b->size,
                          .flags = b->flags,
                          .owner = b->owner,
                          .serial = b->serial,
                          .live = b->state == State::live};
  return true;
}

}  // namespace cachalloc
