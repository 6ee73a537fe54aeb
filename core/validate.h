// validate.h — the invariant checker's parts (validate.cpp: the walk over
// segments and blocks; validate_lists.cpp: the lists, caches, ledger and
// statistics), one named check per invariant of block.h, free_index.h,
// thread_cache.h, ledger.h and caching_allocator.h.
//
// CachingAllocator::validate() runs every check and throws InvariantError
// for the first that fails, its message naming the invariant:
//   invariant 'free block is in its bin': block 0x7f0000200000 size 512 phase detached
// Tests call it after every operation, so the walk over blocks is one pass
// that runs each block's checks in turn.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>

#include "caching_allocator.h"

namespace cachalloc {

// Reports a violated invariant (throws InvariantError).
[[noreturn]] void invariant_failed(const char* invariant, const std::string& where);
std::string describe(const Block* b);
std::string describe(const Segment* seg);
std::string describe_address(DevicePtr at);
inline void expect(bool ok, const char* invariant, const Block* b) {
  if (!ok) [[unlikely]] invariant_failed(invariant, describe(b));
}
inline void expect(bool ok, const char* invariant, const Segment* seg) {
  if (!ok) [[unlikely]] invariant_failed(invariant, describe(seg));
}
inline void expect_at(bool ok, const char* invariant, DevicePtr at) {
  if (!ok) [[unlikely]] invariant_failed(invariant, describe_address(at));
}

// Friend of CachingAllocator, Front and Ledger; lives for one validate()
// call, the allocator's and the thread caches' locks held.
class Validator {
 public:
  explicit Validator(const CachingAllocator& a) : a_(a) {}
  void run();

 private:
  // validate.cpp: segments and their blocks, one pass.
  void walk_segments();
  void check_segment_map(DevicePtr key, const Segment* seg);
  void check_segment_tag(const Segment* seg);
  void check_runs_tile_pages(const Segment* seg);
  void check_retiring_pages(const Segment* seg);
  void check_blocks_tile(const Segment* seg, const Block* b, DevicePtr expect_ptr);
  void check_phase_known(const Block* b);
  void check_free_neighbours_merged(const Block* b);
  void check_unmapped_neighbours_merged(const Block* b);
  void check_unmapped_block(const Block* b);
  void check_pages_match_phase(const Segment* seg, const Block* b);
  void check_exported_only_live(const Block* b);
  void check_live_map(const Block* b);
  void check_in_bin_iff_free(const Segment* seg, const Block* b);
  void check_pending_count(const Block* b);
  void check_thread_owned(const Segment* seg, const Block* b);
  void check_held(const Block* b);
  void count_block(const Segment* seg, const Block* b, bool split);
  void check_retained_segment(const Segment* seg, int retained, bool busy);

  // validate_lists.cpp: everything else.
  std::unordered_map<const Block*, int> pending_references() const;
  void check_thread_caches();
  void check_held_in_segment();
  void check_lists_name_live_blocks();
  void check_tag_backups();
  void check_pools_hold_only_segment_blocks();
  void check_owners();
  void check_live_map_size();
  void check_event_queues();
  void check_deferred_lists();
  void check_statistics();

  const CachingAllocator& a_;
  DeviceStats recount_;                 // the statistics, recounted from the blocks
  std::size_t deferred_ = 0;            // blocks in phase deferred
  std::size_t tc_owned_ = 0;            // blocks the thread caches list
  std::size_t tc_seen_ = 0;             // thread-owned blocks the walk saw
  std::size_t tc_cached_ = 0;           // of them, freed for the program
  std::size_t in_bins_ = 0;             // blocks the walk found in bins
  bool held_seen_ = false;
  std::unordered_map<const Block*, int> waits_named_;  // per block, the waiting lists' entries
  std::unordered_map<const Segment*, std::size_t> retiring_listed_;  // release_remap's pages per segment
};

}  // namespace cachalloc
