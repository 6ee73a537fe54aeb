// host_cache_check.cpp — the host cache's statistics and its invariants.
//
// validate() recomputes every counter from the blocks themselves, so a
// test (or a debugging session) learns of the first bookkeeping slip at
// the call that made it, not when memory is reused early or leaks.
#include <string>

#include "host_cache.h"

namespace cachalloc {

HostStats HostCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void HostCache::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  for (HostStat* s : {&stats_.allocations, &stats_.segments, &stats_.allocated_bytes, &stats_.requested_bytes,
                      &stats_.reserved_bytes})
    s->reset_peak();
  stats_.max_host_alloc_time_ns = stats_.max_host_free_time_ns = 0;
}

std::vector<std::pair<std::string, std::int64_t>> flatten_host_stats(const HostStats& s) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  auto stat = [&](const char* name, const HostStat& v) {
    const std::string n = name;
    out.emplace_back(n + ".current", v.current);
    out.emplace_back(n + ".peak", v.peak);
    out.emplace_back(n + ".allocated", v.allocated);
    out.emplace_back(n + ".freed", v.freed);
  };
  auto timing = [&](const char* name, std::uint64_t total_ns, std::uint64_t max_ns, std::uint64_t count) {
    const std::string n = name;
    const auto us = [](std::uint64_t ns) { return static_cast<std::int64_t>(ns / 1000); };
    out.emplace_back(n + ".total", us(total_ns));
    out.emplace_back(n + ".max", us(max_ns));
    out.emplace_back(n + ".count", static_cast<std::int64_t>(count));
    out.emplace_back(n + ".avg", count == 0 ? 0 : us(total_ns / count));
  };
  stat("allocated", s.allocations);
  stat("allocated_bytes", s.allocated_bytes);
  stat("segment", s.segments);
  stat("reserved_bytes", s.reserved_bytes);
  stat("requested_bytes", s.requested_bytes);
  out.emplace_back("num_host_alloc", static_cast<std::int64_t>(s.num_host_alloc));
  out.emplace_back("num_host_free", static_cast<std::int64_t>(s.num_host_free));
  timing("host_alloc_time", s.host_alloc_time_ns, s.max_host_alloc_time_ns, s.num_host_alloc);
  timing("host_free_time", s.host_free_time_ns, s.max_host_free_time_ns, s.num_host_free);
  out.emplace_back("cached_bytes", s.cached_bytes);
  out.emplace_back("waiting_bytes", s.waiting_bytes);
  out.emplace_back("num_cache_hits", static_cast<std::int64_t>(s.num_cache_hits));
  out.emplace_back("num_fences", static_cast<std::int64_t>(s.num_fences));
  out.emplace_back("num_over_limit_frees", static_cast<std::int64_t>(s.num_over_limit_frees));
  out.emplace_back("num_oom_retries", static_cast<std::int64_t>(s.num_oom_retries));
  out.emplace_back("num_forgotten", static_cast<std::int64_t>(s.num_forgotten));
  return out;
}

std::string HostCache::validate() const {
  std::lock_guard lock(mutex_);
  std::int64_t live = 0, live_bytes = 0, requested = 0, reserved = 0, cached = 0, waiting_bytes = 0;
  std::size_t on_lists = 0, fenced = 0;
  for (const auto& [base, b] : blocks_) {
    if (b->base != base) return "block keyed by another address";
    if (b->size != class_size(b->size) || class_index(b->size) != b->klass) return "block size is not its class";
    if (b->requested > b->size) return "requested bytes exceed the block";
    if (b->pool == nullptr || b->pool != &pools_.at(PoolKey{b->flags, b->owner}))
      return "block in the pool of other flags or owner";
    reserved += static_cast<std::int64_t>(b->size);
    if (b->state == State::live) {
      ++live;
      live_bytes += static_cast<std::int64_t>(b->size);
      requested += static_cast<std::int64_t>(b->requested);
    } else {
      cached += static_cast<std::int64_t>(b->size);
    }
    if (b->state == State::waiting || b->state == State::fenced) waiting_bytes += static_cast<std::int64_t>(b->size);
  }
  auto it_next = blocks_.begin();
  for (auto it = blocks_.begin(); it != blocks_.end(); it = it_next) {
    it_next = std::next(it);
    if (it_next != blocks_.end() && it->first + it->second->size > it_next->first) return "blocks overlap";
  }
  for (const auto& [key, pool] : pools_)
    for (int k = 0; k < kClasses; ++k) {
      int waiting_here = 0;
      for (const Block* b : waiting_) waiting_here += (b->pool == &pool && b->klass == k);
      if (waiting_here != pool.waiting[k]) return "pool's waiting count is wrong";
      for (const Block* b : pool.free[k]) {
        ++on_lists;
        if (b->state != State::free || b->pool != &pool || b->klass != k) return "free list holds a block not free";
        if (!blocks_.contains(b->base)) return "free list holds a released block";
      }
    }
  for (const Block* b : waiting_)
    if (b->state != State::waiting) return "waiting list holds a block not waiting";
  for (const FenceBatch& f : fences_)
    for (const Block* b : f.blocks) {
      ++fenced;
      if (b->state != State::fenced) return "fence holds a block not fenced";
    }
  std::size_t free_blocks = 0, waiting_blocks = 0, fenced_blocks = 0;
  for (const auto& [base, b] : blocks_) {
    free_blocks += b->state == State::free;
    waiting_blocks += b->state == State::waiting;
    fenced_blocks += b->state == State::fenced;
  }
  if (free_blocks != on_lists) return "a free block is on no free list (or on two)";
  if (waiting_blocks != waiting_.size()) return "a waiting block is not on the waiting list";
  if (fenced_blocks != fenced) return "a fenced block is behind no fence";
  if (live != stats_.allocations.current) return "allocations.current is wrong";
  if (live_bytes != stats_.allocated_bytes.current) return "allocated_bytes.current is wrong";
  if (requested != stats_.requested_bytes.current) return "requested_bytes.current is wrong";
  if (reserved != stats_.reserved_bytes.current) return "reserved_bytes.current is wrong";
  if (static_cast<std::int64_t>(blocks_.size()) != stats_.segments.current) return "segments.current is wrong";
  if (cached != stats_.cached_bytes) return "cached_bytes is wrong";
  if (waiting_bytes != stats_.waiting_bytes) return "waiting_bytes is wrong";
  if (static_cast<std::size_t>(cached) > max_cached_) return "cached bytes exceed the limit";
  return "";
}

}  // namespace cachalloc
