// validate.cpp — the invariant checker (mimalloc's debug validation).
//
// Walks every segment and block, checks the structural invariants written in
// block.h, and recounts every statistic from scratch; throws InvariantError
// naming the first violation.  Tests call it after every operation.
#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "caching_allocator.h"
#include "size_policy.h"

namespace cachalloc {

namespace {

[[noreturn]] void fail(const std::string& what, DevicePtr where) {
  std::ostringstream os;
  os << "invariant violated: " << what << " (at 0x" << std::hex << where << ")";
  throw InvariantError(os.str());
}

void check(bool ok, const char* what, DevicePtr where) {
  if (!ok) fail(what, where);
}

struct Recount {
  DeviceStats s;
  std::size_t deferred = 0;
};

void check_current(const StatArray& got, const StatArray& want, const char* name) {
  for (int t = 0; t < kNumStatTypes; ++t)
    if (got.a[t].current != want.a[t].current) {
      std::ostringstream os;
      os << "stat " << name << "." << stat_type_name(static_cast<StatType>(t)) << ".current is "
         << got.a[t].current << ", recount gives " << want.a[t].current;
      throw InvariantError(os.str());
    }
}

}  // namespace

// The held block's invariants (caching_allocator.h, held_).
void CachingAllocator::check_held(const Block* b) const {
  check(b->is_free() && !b->in_pool && !b->deferred && !b->exported, "held block busy, pooled or deferred", b->ptr);
  check(!b->segment->expandable && b->segment->retained == 0, "held block in an expandable or exporting segment",
        b->ptr);
  check(b->next != nullptr && b->next->is_free() && b->next->in_pool, "held block's successor not free in its bin",
        b->ptr);
  check(b->prev == nullptr || !b->prev->is_free(), "held block's predecessor free", b->ptr);
}

// The thread caches' invariants (thread_cache.h), their locks held:
//  * a cached block is thread-owned by that cache, not live for the program,
//    allocated for the core and in the live map, in the bin of its size;
//  * a handed-out block is in the cache's out map, owned by it and live;
//  * a waiting block (point (g)) is owned, not live, marked tc_waiting,
//    allocated for the core and in the live map, in the waiting list or
//    behind one of the cache's fences, whose counts agree;
//  * owned bytes = cached + handed-out + waiting + fenced bytes <= the
//    cache's limit;
//  * thread-owned blocks are small-pool, plain-segment, unexported blocks
//    with no recorded stream (checked in the segment walk).
// Returns how many blocks the caches own.
std::size_t CachingAllocator::check_thread_caches() const {
  std::size_t owned = 0, caches = 0;
  for (const ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    ++caches;
    check(tc->alloc == this && tc->alloc_serial == serial_, "thread cache of another allocator", 0);
    std::size_t cached = 0, cached_bytes = 0, out_bytes = 0;
    for (std::size_t i = 0; i < ThreadCache::kBins; ++i)
      for (const Block* b = tc->bins[i]; b != nullptr; b = b->free_next) {
        check(b->tc == tc && !b->tc_live && !b->tc_waiting && b->allocated, "cached block not owned, or live", b->ptr);
        check(ThreadCache::bin_of(b->size) == i, "cached block in another size's bin", b->ptr);
        check(live_.find(b->ptr) == b, "cached block missing from the live map", b->ptr);
        ++cached;
        cached_bytes += b->size;
      }
    // Waiting and fenced blocks (point (g)).
    auto walk_held = [&](const Block* list) {
      std::size_t n = 0;
      for (const Block* b = list; b != nullptr; b = b->free_next, ++n) {
        check(b->tc == tc && !b->tc_live && b->tc_waiting && b->allocated, "waiting block not owned, or live", b->ptr);
        check(live_.find(b->ptr) == b, "waiting block missing from the live map", b->ptr);
        cached_bytes += b->size;
      }
      cached += n;
      return n;
    };
    const std::size_t before_waiting = cached_bytes;
    check(walk_held(tc->waiting) == tc->waiting_count && cached_bytes - before_waiting == tc->waiting_bytes,
          "thread cache's waiting count disagrees", 0);
    check(tc->fence_count <= ThreadCache::kMaxFences && tc->fence_head < ThreadCache::kMaxFences,
          "thread cache's fence ring", 0);
    for (std::size_t k = 0; k < tc->fence_count; ++k) {
      const ThreadCache::Fenced& f = tc->fences[(tc->fence_head + k) % ThreadCache::kMaxFences];
      check(walk_held(f.blocks) == f.count && f.count != 0, "thread cache's fence batch disagrees with its count", 0);
    }
    tc->for_each_out([&](DevicePtr ptr, const Block* b) {
      check(b->ptr == ptr && b->tc == tc && b->tc_live && b->allocated, "handed-out block not owned, or freed", ptr);
      check(live_.find(ptr) == b, "handed-out block missing from the live map", ptr);
      check(b->requested <= b->size && b->id != 0 && b->id <= next_id_, "handed-out block's identity", ptr);
      out_bytes += b->size;
    });
    check(tc->owned_bytes == cached_bytes + out_bytes && tc->owned_bytes <= tc->limit,
          "thread cache owns other bytes than its blocks, or more than its limit", 0);
    check(tc->next_id <= tc->id_end && tc->id_end <= next_id_ + 1, "thread cache ids outside its reservation", 0);
    owned += cached + tc->out_count();
  }
  check(caches == tcs_count_, "thread cache count disagrees with the list", 0);
  return owned;
}

// Per block, its entries in the lists of frees waiting for something.
std::unordered_map<const Block*, int> CachingAllocator::pending_references() const {
  std::unordered_map<const Block*, int> refs;
  for (const auto& [stream, queue] : pending_)
    for (const PendingEvent& pe : queue) ++refs[pe.block];
  for (const Block* b : unsynced_) ++refs[b];
  for (const Block* b = deferred_; b != nullptr; b = b->free_next) ++refs[b];
  for (const FenceBatch& f : fences_)
    for (const Block* b = f.blocks; b != nullptr; b = b->free_next) ++refs[b];
  return refs;
}

void CachingAllocator::validate() const {
  std::lock_guard lock(mutex_);
  lock_thread_caches();
  struct Unlock {
    const CachingAllocator* a;
    ~Unlock() { a->unlock_thread_caches(); }
  } unlock_caches{this};
  const std::size_t tc_owned = check_thread_caches();
  std::size_t tc_seen = 0;
  std::size_t tc_cached = 0;
  Recount rc;
  std::size_t free_in_pools = 0;
  bool held_seen = false;
  DevicePtr last_end = 0;
  std::map<const Segment*, std::size_t> retiring_listed;  // pages release_remap's list holds, per segment
  for (const RetiringRuns& r : retiring_)
    for (const auto& [seg, run] : r.runs) retiring_listed[seg] += run.bytes / seg->page;
  // What each block waits for, as the lists name it: a block's pending
  // count must be exactly its entries there (event queues, unsynced, the
  // deferred list, fence batches), and every block they name must be a
  // block of a segment.  Blocks are recycled most recent first, so a stale
  // pointer left in a list would otherwise complete the next new block:
  // an early reuse no total can show.
  std::unordered_map<const Block*, int> waits_named = pending_references();
  for (const auto& [base, seg] : segments_) {
    check(base == seg->base, "segment map key differs from its base", base);
    check(seg->base >= last_end, "segments overlap", base);
    last_end = seg->base + seg->size;
    check(seg->head != nullptr && seg->head->prev == nullptr, "segment head missing or has a prev", base);
    check(seg->head->ptr == seg->base, "first block does not start at the segment base", base);
    const bool small = seg->small;
    rc.s.segment.increase(small, 1);
    rc.s.reserved_bytes.increase(small, static_cast<std::int64_t>(mapped_bytes(seg)));
    if (!seg->expandable && seg->size >= config_.max_split_size) rc.s.oversize_segments.increase(1);
    if (seg->tag != kUntagged) {
      check(seg->expandable, "tagged segment is not a reservation", base);
      check(std::count(seg->paused.begin(), seg->paused.end(), true) == static_cast<std::ptrdiff_t>(seg->paused_pages),
            "segment's paused page count disagrees with its pages", base);
      auto ts = tags_.find(seg->tag);
      check(seg->paused_pages == 0 || (ts != tags_.end() && ts->second.paused), "paused pages in a running tag",
            base);
    } else {
      check(seg->paused_pages == 0, "paused pages in an untagged segment", base);
    }
    if (seg->expandable) {
      // Runs (block.h) tile the pages with a handle (or paused), one handle
      // each; a paused page is a run of one.
      std::size_t left = 0;
      MemHandle run_handle = 0;
      for (std::size_t i = 0; i < seg->handles.size(); ++i) {
        const DevicePtr at = seg->base + i * seg->page;
        if (seg->run_pages[i] != 0) {
          check(left == 0, "a run starts inside another", at);
          check(seg->tag == kUntagged || !seg->paused[i] || seg->run_pages[i] == 1, "a paused page in a run of several",
                at);
          left = seg->run_pages[i];
          run_handle = seg->handles[i];
        }
        const bool held = seg->handles[i] != 0 || (seg->tag != kUntagged && seg->paused[i]);
        check(held == (left != 0), "a page with a handle outside every run, or a run's page without one", at);
        if (left != 0) {
          check(seg->handles[i] == run_handle, "pages of one run hold different handles", at);
          --left;
        }
      }
      check(left == 0, "a run past the end of its reservation", base);
      // release_remap (remap_release.cpp): a retiring page has no handle here
      // (it belongs to its new address) and is counted.
      std::size_t retiring = 0;
      for (std::size_t i = 0; i < seg->retiring.size(); ++i) {
        if (!seg->retiring[i]) continue;
        ++retiring;
        check(seg->handles[i] == 0 && seg->run_pages[i] == 0, "a retiring page holds a handle here",
              seg->base + i * seg->page);
      }
      check(retiring == seg->retiring_pages, "retiring pages miscounted", base);
      check(retiring == retiring_listed[seg], "retiring pages differ from the list of remapped runs", base);
    }
    DevicePtr expect = seg->base;
    // The held block and its successor count as one block (reuse_path.cpp).
    const bool holds = held_ != nullptr && held_->segment == seg;
    const bool split = holds ? seg->head->next->next != nullptr : seg->head->next != nullptr;
    int retained = 0;
    bool busy = false;  // an allocated or pending block
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      check(b->segment == seg, "block points at another segment", b->ptr);
      check(b->ptr == expect, "blocks do not tile the segment (gap or overlap)", b->ptr);
      check(b->size > 0 && b->size % kMinBlockSize == 0, "block size is not a positive multiple of 512", b->ptr);
      check(b->stream == seg->stream, "block stream differs from its segment's", b->ptr);
      if (b->next != nullptr) check(b->next->prev == b, "neighbours not linked both ways", b->ptr);
      if (b->next != nullptr) {
        check(!(b->is_free() && b->next->is_free()) || b == held_, "two free neighbours left unmerged", b->ptr);
        check(b->mapped || b->next->mapped || retiring_block(b) || retiring_block(b->next),
              "two unmapped neighbours left unmerged", b->ptr);
      }
      if (!b->mapped) {
        check(seg->expandable, "unmapped block outside an expandable segment", b->ptr);
        check(!b->allocated && b->pending_events == 0, "unmapped block in use", b->ptr);
        check((b->ptr - seg->base) % seg->page == 0 && b->size % seg->page == 0, "unmapped range not page-aligned",
              b->ptr);
      }
      if (seg->expandable) {
        // A mapped block's pages all have handles; an unmapped block's none.
        const std::size_t first = (b->ptr - seg->base) / seg->page;
        const std::size_t last = (b->ptr + b->size - 1 - seg->base) / seg->page;
        for (std::size_t i = first; i <= last; ++i) {
          const bool paused = seg->tag != kUntagged && seg->paused[i];
          check(!(paused && seg->handles[i] != 0), "paused page still has a handle", b->ptr);
          check((seg->handles[i] != 0 || paused) == b->mapped, "page mapping disagrees with block state", b->ptr);
          check(seg->retiring.empty() || seg->retiring[i] == retiring_block(b),
                "a block only partly retiring (or a mapped block over a retiring page)", b->ptr);
        }
      }
      if (b->retained) {
        ++retained;
        check(!b->allocated && b->pending_events == 0 && b->mapped, "retained block in use or unmapped", b->ptr);
      }
      check(!b->exported || b->allocated, "exported flag on a block not allocated", b->ptr);
      busy = busy || b->allocated || b->pending_events != 0;
      const bool in_live = live_.find(b->ptr) == b;
      check((b->allocated || b == held_) == in_live, "allocated flag disagrees with the live map", b->ptr);
      const BlockPool& pool = small ? small_pool_ : large_pool_;
      const bool pooled = b->in_pool;
      if (b == held_) {
        check_held(b);
        held_seen = true;
      }
      else check(pooled == b->is_free(), "free block missing from its pool, or busy block in it", b->ptr);
      check(seg->bins == pool.blocks.bins_of(seg->stream, seg->tag),
            "segment indexed in another stream's, pool's or tag's bins", b->ptr);
      if (pooled) {
        ++free_in_pools;
        if (const char* why = seg->bins->check(b)) check(false, why, b->ptr);
      }
      check(b->deferred == false || (b->pending_events == 1 && !b->allocated), "deferred block in another state",
            b->ptr);
      if (b->deferred) ++rc.deferred;
      const auto bytes = static_cast<std::int64_t>(b->size);
      // A thread-cached block is allocated for the core, freed for the
      // program and the statistics (thread_cache.h).
      const bool cached = b->tc != nullptr && !b->tc_live;
      // (A waiting one stays active and deferred, as the core's own.)
      const bool tc_waiting = cached && b->tc_waiting;
      if (b->tc != nullptr) {
        check(b->allocated && small && !seg->expandable && !b->exported && b->stream_uses.empty(),
              "thread-owned block of a kind the caches never take", b->ptr);
        ++tc_seen;
        tc_cached += cached;
      }
      if (b->allocated && !cached) {
        rc.s.allocation.increase(small, 1);
        rc.s.allocated_bytes.increase(small, bytes);
        rc.s.requested_bytes.increase(small, static_cast<std::int64_t>(b->requested));
        check(b->requested <= b->size, "requested size exceeds block size", b->ptr);
        if (b->size >= config_.max_split_size) rc.s.oversize_allocations.increase(1);
      }
      if (!b->mapped) {
        // address space only: in no statistic
      } else if (!b->is_free()) {
        if (cached && !tc_waiting) {
          // counted in no statistic but reserved/segment
        } else {
          rc.s.active.increase(small, 1);
          rc.s.active_bytes.increase(small, bytes);
        }
      } else if (split) {
        // (The held block's bytes belong to the block its successor ends.)
        if (b != held_) rc.s.inactive_split.increase(small, 1);
        rc.s.inactive_split_bytes.increase(small, bytes);
      }
      const auto named = waits_named.find(b);
      check(b->pending_events == (named == waits_named.end() ? 0 : named->second),
            "a block's pending count differs from the lists naming it", b->ptr);
      if (named != waits_named.end()) waits_named.erase(named);
      expect = b->ptr + b->size;
    }
    check(expect == seg->base + seg->size, "blocks do not reach the segment end", base);
    check(retained == seg->retained, "segment's retained count disagrees with its blocks", base);
    check(retained == 0 || busy || seg->expandable, "segment of only free and retained blocks was not released",
          base);
  }
  check(held_ == nullptr || held_seen, "held block in no segment", 0);
  check(waits_named.empty(), "a pending list names a block of no segment",
        waits_named.empty() ? 0 : waits_named.begin()->first->ptr);
  // A backup exists only while its tag is paused (a retained host backup:
  // only while it runs, with its buffer); a backup file only for a
  // disk backup with bytes in it (pause_backup.cpp).
  for (const auto& [tag, ts] : tags_) {
    check(!ts.backup_valid || ts.paused, "backup held by a running tag", tag);
    check(!ts.files.empty() == (ts.backup_valid && ts.location == BackupMode::disk && ts.backup_bytes != 0),
          "backup file disagrees with the tag's backup", tag);
    check(ts.backup_valid || ts.location == BackupMode::none, "backup location without a backup", tag);
    check(!ts.retained || (!ts.paused && !ts.backup_valid && ts.host != nullptr), "retained backup out of place", tag);
    check(ts.backup_blocks.empty() || ts.backup_valid || ts.retained, "backup blocks without a backup", tag);
    for (const auto& [ptr, id] : ts.backup_blocks) {
      const Block* b = find_live(ptr);
      check(b != nullptr && b->allocated && b->id == id && b->segment->tag == tag, "a backup names a block not live",
            ptr);
    }
  }
  check(free_in_pools == small_pool_.blocks.size() + large_pool_.blocks.size(),
        "a pool holds a block of no segment", 0);
  check(tc_seen == tc_owned, "thread-owned blocks disagree with the thread caches", 0);
  check_owners();
  check(live_.size() ==
            static_cast<std::size_t>(rc.s.allocation[StatType::aggregate].current) + (held_ != nullptr) + tc_cached,
        "live map holds a block of no segment", 0);
  std::size_t queued = 0;
  for (const auto& [stream, queue] : pending_) queued += queue.size();
  check(queued == pending_count_, "pending event count disagrees with the queues", 0);
  std::size_t listed = 0;
  std::size_t listed_bytes = 0;
  for (const Block* b = deferred_; b != nullptr; b = b->free_next) {
    check(b->deferred, "block in the deferred list not marked deferred", b->ptr);
    ++listed;
    listed_bytes += b->size;
  }
  check(listed == deferred_count_ && listed_bytes == deferred_bytes_, "deferred list disagrees with its counts", 0);
  std::size_t fenced = 0;
  std::size_t fenced_bytes = 0;
  for (const FenceBatch& f : fences_) {
    std::size_t n = 0;
    std::size_t bytes = 0;
    for (const Block* b = f.blocks; b != nullptr; b = b->free_next, ++n) {
      check(b->deferred, "block behind a fence not marked deferred", b->ptr);
      bytes += b->size;
    }
    check(n == f.count && bytes == f.bytes, "fence batch disagrees with its counts", 0);
    fenced += n;
    fenced_bytes += bytes;
  }
  check(fenced == fenced_count_ && fenced_bytes == fenced_bytes_, "fenced blocks disagree with the batches", 0);
  check(listed + fenced == rc.deferred, "deferred blocks missing from the deferred list and fences", 0);
  // (That the lists together hold every block's pending count follows from
  // the per-block check above.)

  // The stored counters as callers read them (allocator_stats.h derives the
  // aggregate and the freed counts): the recount must match what is read.
  const DeviceStats got = settled_stats();
  check_current(got.allocation, rc.s.allocation, "allocation");
  check_current(got.segment, rc.s.segment, "segment");
  check_current(got.active, rc.s.active, "active");
  check_current(got.inactive_split, rc.s.inactive_split, "inactive_split");
  check_current(got.allocated_bytes, rc.s.allocated_bytes, "allocated_bytes");
  check_current(got.reserved_bytes, rc.s.reserved_bytes, "reserved_bytes");
  check_current(got.active_bytes, rc.s.active_bytes, "active_bytes");
  check_current(got.inactive_split_bytes, rc.s.inactive_split_bytes, "inactive_split_bytes");
  check_current(got.requested_bytes, rc.s.requested_bytes, "requested_bytes");
  check(got.oversize_allocations.current == rc.s.oversize_allocations.current, "oversize_allocations recount", 0);
  check(got.oversize_segments.current == rc.s.oversize_segments.current, "oversize_segments recount", 0);
  std::size_t deferred_bytes = 0;
  for (const Block* b = deferred_; b != nullptr; b = b->free_next) deferred_bytes += b->size;
  for (const FenceBatch& f : fences_)
    for (const Block* b = f.blocks; b != nullptr; b = b->free_next) deferred_bytes += b->size;
  for (const ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    for (const Block* b = tc->waiting; b != nullptr; b = b->free_next) deferred_bytes += b->size;
    for (std::size_t k = 0; k < tc->fence_count; ++k)
      for (const Block* b = tc->fences[(tc->fence_head + k) % ThreadCache::kMaxFences].blocks; b != nullptr;
           b = b->free_next)
        deferred_bytes += b->size;
  }
  check(got.deferred_free_bytes.current == static_cast<std::int64_t>(deferred_bytes),
        "deferred_free_bytes disagrees with the deferred blocks", 0);
  for (const StatArray* arr : {&got.allocation, &got.segment, &got.active, &got.allocated_bytes,
                               &got.reserved_bytes, &got.active_bytes, &got.requested_bytes})
    for (const Stat& st : arr->a) {
      check(st.peak >= st.current && st.current >= 0, "peak below current, or negative current", 0);
      if (!accumulated_reset_)
        check(st.allocated - st.freed == st.current, "allocated - freed differs from current", 0);
    }
}

// The owner ledger (owner_ledger.cpp): every held block allocated, in the
// live map, not thread-owned, owned by and listed once in exactly its
// token's entry; the entries' bytes are capture_held_bytes; nothing else is
// held.
void CachingAllocator::check_owners() const {
  std::size_t listed = 0, bytes = 0;
  std::unordered_map<const Block*, int> seen;
  for (const auto& [token, blocks] : owners_)
    for (const Block* b : blocks) {
      check(b->owner_held && b->owner == token, "ledger lists a block not held for its token", b->ptr);
      check(b->allocated && b->tc == nullptr && live_.find(b->ptr) == b, "held block not allocated and live",
            b->ptr);
      check(++seen[b] == 1, "held block listed twice", b->ptr);
      ++listed;
      bytes += b->size;
    }
  check(static_cast<std::int64_t>(bytes) == stats_.capture_held_bytes.current,
        "capture_held_bytes disagrees with the ledger", 0);
  std::size_t held = 0;
  for (const auto& [base, seg] : segments_)
    for (const Block* b = seg->head; b != nullptr; b = b->next) held += b->owner_held ? 1 : 0;
  check(held == listed, "a held block is in no ledger entry", 0);
}

}  // namespace cachalloc
