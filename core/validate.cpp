// validate.cpp — the invariant checker (mimalloc's debug validation): the
// walk over every segment and block, one named check per invariant of
// block.h (validate.h says how they report; validate_lists.cpp checks the
// waiting lists, thread caches, owner ledger and statistics).
#include "validate.h"

#include <algorithm>
#include <sstream>

#include "size_policy.h"

namespace cachalloc {

void invariant_failed(const char* invariant, const std::string& where) {
  throw InvariantError(std::string("invariant '") + invariant + "': " + where);
}

std::string describe(const Block* b) {
  std::ostringstream os;
  os << "block 0x" << std::hex << b->ptr << std::dec << " size " << b->size << " phase "
     << block_phase_name(b->phase());
  return os.str();
}

std::string describe(const Segment* seg) {
  std::ostringstream os;
  os << "segment 0x" << std::hex << seg->base << std::dec << " size " << seg->size;
  return os.str();
}

std::string describe_address(DevicePtr at) {
  std::ostringstream os;
  os << "at 0x" << std::hex << at;
  return os.str();
}

void CachingAllocator::validate() const {
  std::lock_guard lock(mutex_);
  front_.lock_all();
  struct Unlock {
    const CachingAllocator* a;
    ~Unlock() { a->front_.unlock_all(); }
  } unlock_caches{this};
  Validator(*this).run();
}

void Validator::run() {
  check_thread_caches();
  for (const auto& r : a_.ledger_.retiring_)
    for (const auto& [seg, run] : r.runs) retiring_listed_[seg] += run.bytes / seg->page;
  waits_named_ = pending_references();
  walk_segments();
  check_held_in_segment();
  check_lists_name_live_blocks();
  check_tag_backups();
  check_pools_hold_only_segment_blocks();
  expect_at(tc_seen_ == tc_owned_, "thread-owned blocks are the thread caches' blocks", 0);
  check_owners();
  check_live_map_size();
  check_event_queues();
  check_deferred_lists();
  check_statistics();
}

void Validator::walk_segments() {
  DevicePtr last_end = 0;
  for (const auto& [base, seg] : a_.segments_) {
    check_segment_map(base, seg);
    expect(seg->base >= last_end, "segments do not overlap", seg);
    last_end = seg->base + seg->size;
    recount_.segment.increase(seg->small, 1);
    recount_.reserved_bytes.increase(seg->small, static_cast<std::int64_t>(a_.mapped_bytes(seg)));
    if (!seg->expandable && seg->size >= a_.config_.max_split_size) recount_.oversize_segments.increase(1);
    check_segment_tag(seg);
    if (seg->expandable) {
      check_runs_tile_pages(seg);
      check_retiring_pages(seg);
    }
    // The held block and its successor count as one block (reuse_path.cpp).
    const bool holds = a_.held_ != nullptr && a_.held_->segment == seg;
    const bool split = holds ? seg->head->next->next != nullptr : seg->head->next != nullptr;
    int retained = 0;
    bool busy = false;  // an allocated or pending block
    DevicePtr expect_ptr = seg->base;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      check_blocks_tile(seg, b, expect_ptr);
      check_phase_known(b);
      check_free_neighbours_merged(b);
      check_unmapped_neighbours_merged(b);
      check_unmapped_block(b);
      if (seg->expandable) check_pages_match_phase(seg, b);
      check_exported_only_live(b);
      check_live_map(b);
      check_in_bin_iff_free(seg, b);
      check_pending_count(b);
      check_thread_owned(seg, b);
      if (b == a_.held_) check_held(b);
      count_block(seg, b, split);
      retained += b->phase() == BlockPhase::retained;
      busy = busy || b->is_allocated() || b->pending_events != 0;
      expect_ptr = b->ptr + b->size;
    }
    expect(expect_ptr == seg->base + seg->size, "a segment's blocks tile it (they reach its end)", seg);
    check_retained_segment(seg, retained, busy);
  }
}

// ------------------------------------------------------------- segments

void Validator::check_segment_map(DevicePtr key, const Segment* seg) {
  expect(key == seg->base, "the segment map is keyed by base", seg);
  expect(seg->head != nullptr && seg->head->prev == nullptr && seg->head->ptr == seg->base,
         "a segment's first block starts at its base", seg);
  expect(seg->bins == (seg->small ? a_.small_pool_ : a_.large_pool_).blocks.bins_of(seg->stream, seg->tag),
         "a segment is indexed in its own stream's, pool's and tag's bins", seg);
}

// Tags (block.h): tagged segments are reservations; paused pages only in
// a paused tag, and counted.
void Validator::check_segment_tag(const Segment* seg) {
  if (seg->tag == kUntagged) {
    expect(seg->paused_pages == 0, "paused pages only in tagged segments", seg);
    return;
  }
  expect(seg->expandable, "a tagged segment is a reservation", seg);
  expect(std::count(seg->paused.begin(), seg->paused.end(), true) == static_cast<std::ptrdiff_t>(seg->paused_pages),
         "a segment's paused page count matches its pages", seg);
  auto ts = a_.tags_.find(seg->tag);
  expect(seg->paused_pages == 0 || (ts != a_.tags_.end() && ts->second.paused), "paused pages only in a paused tag",
         seg);
}

// Runs (block.h) tile the pages with a handle (or paused), one handle
// each; a paused page is a run of one.
void Validator::check_runs_tile_pages(const Segment* seg) {
  constexpr const char* kInvariant = "runs tile the mapped pages, one handle each";
  std::size_t left = 0;
  MemHandle run_handle = 0;
  for (std::size_t i = 0; i < seg->handles.size(); ++i) {
    const DevicePtr at = seg->base + i * seg->page;
    if (seg->run_pages[i] != 0) {
      expect_at(left == 0, kInvariant, at);  // (a run starting inside another)
      expect_at(seg->tag == kUntagged || !seg->paused[i] || seg->run_pages[i] == 1, "a paused page is a run of one",
                at);
      left = seg->run_pages[i];
      run_handle = seg->handles[i];
    }
    const bool held = seg->handles[i] != 0 || (seg->tag != kUntagged && seg->paused[i]);
    expect_at(held == (left != 0), kInvariant, at);  // (a handle outside every run, or a run's page without one)
    if (left != 0) {
      expect_at(seg->handles[i] == run_handle, kInvariant, at);  // (one run, two handles)
      --left;
    }
  }
  expect(left == 0, kInvariant, seg);  // (a run past the end of its reservation)
}

// release_remap (remap_release.cpp): a retiring page has no handle here (it
// belongs to its new address), and is counted and listed in the ledger
// (ledger.h).
void Validator::check_retiring_pages(const Segment* seg) {
  std::size_t retiring = 0;
  for (std::size_t i = 0; i < seg->retiring.size(); ++i) {
    if (!seg->retiring[i]) continue;
    ++retiring;
    expect_at(seg->handles[i] == 0 && seg->run_pages[i] == 0, "a retiring page holds no handle here",
              seg->base + i * seg->page);
  }
  expect(retiring == seg->retiring_pages, "a segment's retiring page count matches its pages", seg);
  auto listed = retiring_listed_.find(seg);
  expect(retiring == (listed == retiring_listed_.end() ? 0 : listed->second),
         "retiring pages are those of the list of remapped runs", seg);
}

// A non-expandable segment of only free and retained blocks went back.
void Validator::check_retained_segment(const Segment* seg, int retained, bool busy) {
  expect(retained == seg->retained, "a segment's retained count matches its blocks", seg);
  expect(retained == 0 || busy || seg->expandable, "a segment of only free and retained blocks is released", seg);
}

// --------------------------------------------------------------- blocks

void Validator::check_blocks_tile(const Segment* seg, const Block* b, DevicePtr expect_ptr) {
  expect(b->segment == seg, "a block points at its segment", b);
  expect(b->ptr == expect_ptr, "a segment's blocks tile it (no gap, no overlap)", b);
  expect(b->size > 0 && b->size % kMinBlockSize == 0, "a block's size is a positive multiple of 512", b);
  expect(b->stream == seg->stream, "a block carries its segment's stream", b);
  expect(b->next == nullptr || b->next->prev == b, "neighbours link both ways", b);
}

// Between two calls every block of a segment is placed (block.h's table):
// never detached, never a spare.
void Validator::check_phase_known(const Block* b) {
  expect(b->phase() != BlockPhase::detached && b->phase() != BlockPhase::spare &&
             static_cast<int>(b->phase()) < kNumBlockPhases,
         "a segment's block is placed (not detached, not spare)", b);
}

void Validator::check_free_neighbours_merged(const Block* b) {
  if (b->next == nullptr) return;
  expect(!(b->is_free() && b->next->is_free()) || b == a_.held_, "no two free neighbours are left unmerged", b);
}

void Validator::check_unmapped_neighbours_merged(const Block* b) {
  if (b->next == nullptr) return;
  expect(b->is_mapped() || b->next->is_mapped() || a_.retiring_block(b) || a_.retiring_block(b->next),
         "no two unmapped neighbours are left unmerged", b);
}

void Validator::check_unmapped_block(const Block* b) {
  if (b->is_mapped()) return;
  const Segment* seg = b->segment;
  expect(seg->expandable, "unmapped blocks only in expandable segments", b);
  expect((b->ptr - seg->base) % seg->page == 0 && b->size % seg->page == 0, "an unmapped block is page-aligned", b);
}

// A mapped block's pages all have handles (or are paused); an unmapped
// block's none; a block retires whole or not at all.
void Validator::check_pages_match_phase(const Segment* seg, const Block* b) {
  const std::size_t first = (b->ptr - seg->base) / seg->page;
  const std::size_t last = (b->ptr + b->size - 1 - seg->base) / seg->page;
  for (std::size_t i = first; i <= last; ++i) {
    const bool paused = seg->tag != kUntagged && seg->paused[i];
    expect(!(paused && seg->handles[i] != 0), "a paused page holds no handle", b);
    expect((seg->handles[i] != 0 || paused) == b->is_mapped(), "a block's pages are mapped as its phase says", b);
    expect(seg->retiring.empty() || seg->retiring[i] == a_.retiring_block(b),
           "a block retires whole (and no mapped block lies over a retiring page)", b);
  }
}

void Validator::check_exported_only_live(const Block* b) {
  expect(!b->exported || b->is_allocated(), "only an allocated block is marked exported", b);
}

// The live map holds exactly the blocks allocated for the core, and the
// held block (which keeps its entry: reuse_path.cpp).
void Validator::check_live_map(const Block* b) {
  const bool in_live = a_.live_.find(b->ptr) == b;
  expect((b->is_allocated() || b == a_.held_) == in_live, "a block is in the live map iff allocated (or held)", b);
  if (b->is_allocated() && b->phase() != BlockPhase::tc_cached && b->phase() != BlockPhase::tc_waiting)
    expect(b->requested <= b->size, "a live block's requested size fits in it", b);
}

// free_index.h: a block is in a bin exactly while free, in the bin its size
// selects, of its segment's bins.
void Validator::check_in_bin_iff_free(const Segment* seg, const Block* b) {
  if (b->phase() != BlockPhase::free) return;
  ++in_bins_;
  if (const char* why = seg->bins->check(b)) invariant_failed("a free block is in its bin", describe(b) + ": " + why);
}

// A block's pending count is exactly its entries in the waiting lists
// (event queues, unsynced, deferred list, fence batches): above 0 while
// pending, 1 while deferred, 0 otherwise.
void Validator::check_pending_count(const Block* b) {
  const auto named = waits_named_.find(b);
  expect(b->pending_events == (named == waits_named_.end() ? 0 : named->second),
         "a block's pending count is its entries in the waiting lists", b);
  if (named != waits_named_.end()) waits_named_.erase(named);
  const BlockPhase p = b->phase();
  expect(p != BlockPhase::deferred || b->pending_events == 1, "a deferred block waits for its fence alone", b);
  expect((p == BlockPhase::pending || p == BlockPhase::deferred) == (b->pending_events > 0),
         "a block waits for events or a fence exactly while pending or deferred", b);
  if (p == BlockPhase::deferred) ++deferred_;
}

// thread_cache.h: thread-owned blocks (tc set exactly in the tc_* phases)
// are small-pool, plain-segment, unexported blocks with no recorded stream.
void Validator::check_thread_owned(const Segment* seg, const Block* b) {
  const BlockPhase p = b->phase();
  const bool tc_phase = p == BlockPhase::tc_out || p == BlockPhase::tc_cached || p == BlockPhase::tc_waiting;
  expect(tc_phase == (b->tc != nullptr), "a block has a thread cache exactly in the tc_* phases", b);
  if (b->tc == nullptr) return;
  expect(seg->small && !seg->expandable && !b->exported && b->stream_uses.empty(),
         "thread-owned blocks are of a kind the caches take", b);
  ++tc_seen_;
  tc_cached_ += p != BlockPhase::tc_out;
}

// The held block (caching_allocator.h, held_).
void Validator::check_held(const Block* b) {
  held_seen_ = true;
  expect(b->phase() == BlockPhase::held && !b->exported, "the held block is in phase held, unexported", b);
  expect(!b->segment->expandable && b->segment->retained == 0,
         "the held block is in a plain segment without retained blocks", b);
  expect(b->next != nullptr && b->next->phase() == BlockPhase::free, "the held block's successor is free in its bin",
         b);
  expect(b->prev == nullptr || !b->prev->is_free(), "the held block's predecessor is not free", b);
}

// The statistics as the blocks give them (compared in check_statistics).
// A thread-cached block is allocated for the core, freed for the program
// and the statistics (thread_cache.h); a waiting one stays active, as the
// core's own deferred blocks.
void Validator::count_block(const Segment* seg, const Block* b, bool split) {
  const bool small = seg->small;
  const auto bytes = static_cast<std::int64_t>(b->size);
  const BlockPhase p = b->phase();
  const bool cached = p == BlockPhase::tc_cached || p == BlockPhase::tc_waiting;
  if (b->is_allocated() && !cached) {
    recount_.allocation.increase(small, 1);
    recount_.allocated_bytes.increase(small, bytes);
    recount_.requested_bytes.increase(small, static_cast<std::int64_t>(b->requested));
    if (b->size >= a_.config_.max_split_size) recount_.oversize_allocations.increase(1);
  }
  if (!b->is_mapped()) return;  // address space only: in no statistic
  if (!b->is_free()) {
    if (p != BlockPhase::tc_cached) {  // (a cached block counts in no statistic but reserved/segment)
      recount_.active.increase(small, 1);
      recount_.active_bytes.increase(small, bytes);
    }
  } else if (split) {
    // (The held block's bytes belong to the block its successor ends.)
    if (b != a_.held_) recount_.inactive_split.increase(small, 1);
    recount_.inactive_split_bytes.increase(small, bytes);
  }
}

}  // namespace cachalloc
