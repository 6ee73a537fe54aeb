// validate_lists.cpp — the invariant checker's checks beyond the block walk
// (validate.cpp): thread caches, the ledger's lists (waiting blocks, owner
// tokens: ledger.h), tag backups and the statistics recount, one named
// check per invariant.
#include <sstream>

#include "validate.h"

namespace cachalloc {

namespace {

void check_current(const StatArray& got, const StatArray& want, const char* name) {
  for (int t = 0; t < kNumStatTypes; ++t)
    if (got.a[t].current != want.a[t].current) {
      std::ostringstream os;
      os << "stat " << name << "." << stat_type_name(static_cast<StatType>(t)) << ".current is "
         << got.a[t].current << ", recount gives " << want.a[t].current;
      invariant_failed("every current statistic equals its recount from the blocks", os.str());
    }
}

}  // namespace

// Per block, its entries in the lists of frees waiting for something.
std::unordered_map<const Block*, int> Validator::pending_references() const {
  std::unordered_map<const Block*, int> refs;
  const Ledger& l = a_.ledger_;
  for (const auto& [stream, queue] : l.pending_)
    for (const auto& pe : queue) ++refs[pe.block];
  for (const Block* b : l.unsynced_) ++refs[b];
  for (const Block* b = l.deferred_; b != nullptr; b = b->free_next) ++refs[b];
  for (const auto& f : l.fences_)
    for (const Block* b = f.blocks; b != nullptr; b = b->free_next) ++refs[b];
  return refs;
}

// The thread caches (thread_cache.h), their locks held:
//  * a cached block is owned by that cache, in phase tc_cached, in the live
//    map, in the bin of its size;
//  * a waiting block (point (g)) is owned, in phase tc_waiting, in the live
//    map, in the waiting list or behind one of the cache's fences, whose
//    counts agree;
//  * a handed-out block is in the cache's out map, owned, in phase tc_out;
//  * owned bytes = cached + handed-out + waiting + fenced bytes <= limit.
void Validator::check_thread_caches() {
  std::size_t caches = 0;
  for (const ThreadCache* tc = a_.front_.tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    ++caches;
    expect_at(tc->front == &a_.front_ && tc->alloc_serial == a_.front_.serial_, "a thread cache belongs to its allocator", 0);
    std::size_t cached = 0, cached_bytes = 0, out_bytes = 0;
    for (std::size_t i = 0; i < ThreadCache::kBins; ++i)
      for (const Block* b = tc->bins[i]; b != nullptr; b = b->free_next) {
        expect(b->tc == tc && b->phase() == BlockPhase::tc_cached, "a cache's bins hold its tc_cached blocks", b);
        expect(ThreadCache::bin_of(b->size) == i, "a cached block is in the bin of its size", b);
        expect(a_.live_.find(b->ptr) == b, "a thread-owned block is in the live map", b);
        ++cached;
        cached_bytes += b->size;
      }
    // Waiting and fenced blocks (point (g)).
    auto walk_held = [&](const Block* list) {
      std::size_t n = 0;
      for (const Block* b = list; b != nullptr; b = b->free_next, ++n) {
        expect(b->tc == tc && b->phase() == BlockPhase::tc_waiting,
               "a cache's waiting list and fences hold its tc_waiting blocks", b);
        expect(a_.live_.find(b->ptr) == b, "a thread-owned block is in the live map", b);
        cached_bytes += b->size;
      }
      cached += n;
      return n;
    };
    const std::size_t before_waiting = cached_bytes;
    expect_at(walk_held(tc->waiting) == tc->waiting_count && cached_bytes - before_waiting == tc->waiting_bytes,
              "a thread cache's waiting counts match its list", 0);
    expect_at(tc->fence_count <= ThreadCache::kMaxFences && tc->fence_head < ThreadCache::kMaxFences,
              "a thread cache's fence ring is within bounds", 0);
    for (std::size_t k = 0; k < tc->fence_count; ++k) {
      const ThreadCache::Fenced& f = tc->fences[(tc->fence_head + k) % ThreadCache::kMaxFences];
      expect_at(walk_held(f.blocks) == f.count && f.count != 0, "a thread cache's fence batch matches its count", 0);
    }
    tc->for_each_out([&](DevicePtr ptr, const Block* b) {
      expect(b->ptr == ptr && b->tc == tc && b->phase() == BlockPhase::tc_out,
             "a cache's out map holds its tc_out blocks", b);
      expect(a_.live_.find(ptr) == b, "a thread-owned block is in the live map", b);
      expect(b->requested <= b->size && b->id != 0 && b->id <= a_.next_id_,
             "a handed-out block has a size and an id of its own", b);
      out_bytes += b->size;
    });
    expect_at(tc->owned_bytes == cached_bytes + out_bytes && tc->owned_bytes <= tc->limit,
              "a thread cache owns its blocks' bytes, within its limit", 0);
    expect_at(tc->next_id <= tc->id_end && tc->id_end <= a_.next_id_ + 1, "a thread cache's ids are its reservation",
              0);
    tc_owned_ += cached + tc->out_count();
  }
  expect_at(caches == a_.front_.tcs_count_, "the thread cache count matches the list", 0);
}

void Validator::check_held_in_segment() {
  expect_at(a_.held_ == nullptr || held_seen_, "the held block is a block of a segment", 0);
}

// Blocks are recycled most recent first, so a stale pointer left in a list
// would complete the next new block: an early reuse no total can show.
void Validator::check_lists_name_live_blocks() {
  expect_at(waits_named_.empty(), "the waiting lists name only blocks of segments",
            waits_named_.empty() ? 0 : waits_named_.begin()->first->ptr);
}

// A backup exists only while its tag is paused (a retained host backup:
// only while it runs, with its buffer); a backup file only for a disk
// backup with bytes in it (pause_backup.cpp).
void Validator::check_tag_backups() {
  constexpr const char* kInvariant = "a tag's backup matches its pause state";
  for (const auto& [tag, ts] : a_.tags_) {
    expect_at(!ts.backup_valid || ts.paused, kInvariant, tag);
    expect_at(!ts.files.empty() == (ts.backup_valid && ts.location == BackupMode::disk && ts.backup_bytes != 0),
              kInvariant, tag);
    expect_at(ts.backup_valid || ts.location == BackupMode::none, kInvariant, tag);
    expect_at(!ts.retained || (!ts.paused && !ts.backup_valid && ts.host != nullptr), kInvariant, tag);
    expect_at(ts.backup_blocks.empty() || ts.backup_valid || ts.retained, kInvariant, tag);
    for (const auto& [ptr, id] : ts.backup_blocks) {
      const Block* b = a_.find_live(ptr);
      expect_at(b != nullptr && b->id == id && b->segment->tag == tag, "a tag's backup names live blocks of the tag",
                ptr);
    }
  }
}

void Validator::check_pools_hold_only_segment_blocks() {
  expect_at(in_bins_ == a_.small_pool_.blocks.size() + a_.large_pool_.blocks.size(),
            "the pools hold only free blocks of segments", 0);
}

// The ledger's owner tokens (ledger_owners.cpp): every held block in phase
// owner_held, in the live map, owned by and listed once in exactly its
// token's entry; the entries' bytes are capture_held_bytes; nothing else is
// held.
void Validator::check_owners() {
  std::size_t listed = 0, bytes = 0;
  std::unordered_map<const Block*, int> seen;
  for (const auto& [token, blocks] : a_.ledger_.owners_)
    for (const Block* b : blocks) {
      expect(b->phase() == BlockPhase::owner_held && b->owner == token && b->tc == nullptr &&
                 a_.live_.find(b->ptr) == b,
             "the ledger lists owner_held blocks of its token, in the live map", b);
      expect(++seen[b] == 1, "the ledger lists a block once", b);
      ++listed;
      bytes += b->size;
    }
  expect_at(static_cast<std::int64_t>(bytes) == a_.stats_.capture_held_bytes.current,
            "capture_held_bytes is the ledger's bytes", 0);
  std::size_t held = 0;
  for (const auto& [base, seg] : a_.segments_)
    for (const Block* b = seg->head; b != nullptr; b = b->next) held += b->phase() == BlockPhase::owner_held;
  expect_at(held == listed, "every owner_held block is in the ledger", 0);
}

void Validator::check_live_map_size() {
  expect_at(a_.live_.size() == static_cast<std::size_t>(recount_.allocation[StatType::aggregate].current) +
                                   (a_.held_ != nullptr) + tc_cached_,
            "the live map holds only blocks of segments", 0);
}

// (The count includes the unsynced blocks: ledger.h, idle().)
void Validator::check_event_queues() {
  const Ledger& l = a_.ledger_;
  std::size_t queued = 0;
  for (const auto& [stream, queue] : l.pending_) queued += queue.size();
  expect_at(queued + l.unsynced_.size() == l.pending_count_,
            "the pending count matches the event queues and the unsynced list", 0);
}

// The deferred list and the fence batches: their blocks deferred, their
// counts right, and together every deferred block.
void Validator::check_deferred_lists() {
  const Ledger& l = a_.ledger_;
  std::size_t listed = 0, listed_bytes = 0;
  for (const Block* b = l.deferred_; b != nullptr; b = b->free_next) {
    expect(b->phase() == BlockPhase::deferred, "the deferred list and fence batches hold deferred blocks", b);
    ++listed;
    listed_bytes += b->size;
  }
  expect_at(listed == l.deferred_count_ && listed_bytes == l.deferred_bytes_,
            "the deferred list matches its counts", 0);
  std::size_t fenced = 0, fenced_bytes = 0;
  for (const auto& f : l.fences_) {
    std::size_t n = 0, bytes = 0;
    for (const Block* b = f.blocks; b != nullptr; b = b->free_next, ++n) {
      expect(b->phase() == BlockPhase::deferred, "the deferred list and fence batches hold deferred blocks", b);
      bytes += b->size;
    }
    expect_at(n == f.count && bytes == f.bytes, "a fence batch matches its counts", 0);
    fenced += n;
    fenced_bytes += bytes;
  }
  expect_at(fenced == l.fenced_count_ && fenced_bytes == l.fenced_bytes_,
            "the fenced counts match the batches", 0);
  expect_at(listed + fenced == deferred_, "every deferred block is in the deferred list or a fence batch", 0);
}

// The stored counters as callers read them (allocator_stats.h derives the
// aggregate and the freed counts): the recount must match what is read.
void Validator::check_statistics() {
  const DeviceStats got = a_.settled_stats();
  check_current(got.allocation, recount_.allocation, "allocation");
  check_current(got.segment, recount_.segment, "segment");
  check_current(got.active, recount_.active, "active");
  check_current(got.inactive_split, recount_.inactive_split, "inactive_split");
  check_current(got.allocated_bytes, recount_.allocated_bytes, "allocated_bytes");
  check_current(got.reserved_bytes, recount_.reserved_bytes, "reserved_bytes");
  check_current(got.active_bytes, recount_.active_bytes, "active_bytes");
  check_current(got.inactive_split_bytes, recount_.inactive_split_bytes, "inactive_split_bytes");
  check_current(got.requested_bytes, recount_.requested_bytes, "requested_bytes");
  expect_at(got.oversize_allocations.current == recount_.oversize_allocations.current &&
                got.oversize_segments.current == recount_.oversize_segments.current,
            "the oversize counts equal their recount from the blocks", 0);
  std::size_t deferred_bytes = 0;
  for (const Block* b = a_.ledger_.deferred_; b != nullptr; b = b->free_next) deferred_bytes += b->size;
  for (const auto& f : a_.ledger_.fences_)
    for (const Block* b = f.blocks; b != nullptr; b = b->free_next) deferred_bytes += b->size;
  for (const ThreadCache* tc = a_.front_.tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    for (const Block* b = tc->waiting; b != nullptr; b = b->free_next) deferred_bytes += b->size;
    for (std::size_t k = 0; k < tc->fence_count; ++k)
      for (const Block* b = tc->fences[(tc->fence_head + k) % ThreadCache::kMaxFences].blocks; b != nullptr;
           b = b->free_next)
        deferred_bytes += b->size;
  }
  expect_at(got.deferred_free_bytes.current == static_cast<std::int64_t>(deferred_bytes),
            "deferred_free_bytes is the deferred blocks' bytes", 0);
  for (const StatArray* arr : {&got.allocation, &got.segment, &got.active, &got.allocated_bytes,
                               &got.reserved_bytes, &got.active_bytes, &got.requested_bytes})
    for (const Stat& st : arr->a) {
      expect_at(st.peak >= st.current && st.current >= 0, "no statistic is negative or above its peak", 0);
      if (!a_.accumulated_reset_)
        expect_at(st.allocated - st.freed == st.current, "allocated - freed = current (until a reset)", 0);
    }
}

}  // namespace cachalloc
