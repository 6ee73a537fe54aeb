// block.h — blocks, segments and the pools that index free blocks.
//
// A block's phase (BlockPhase) is one field; every change goes through
// set_phase(), which a debug build (CACHALLOC_DEBUG, debug_assert.h) checks
// against this table.  A release build stores the byte and nothing else.
//
//   phase       where the block is                       may become
//   ----------  ---------------------------------------  -----------------------------------
//   spare       spare_blocks_ (recycled Block object)    detached (make_block)
//   detached    nowhere, for a moment: the lock holder    free (bin insert), allocated
//               is carving, splitting, merging, parking   (activate), pending (park_until,
//               or releasing it; never seen between two   retire_stream), deferred (defer),
//               locked calls                              retained (retain), unmapped (unmap),
//                                                         spare (merged away, released)
//   free        its segment's bin (free_index.h)         detached (bin erase)
//   held        held_, unmerged (reuse_path.cpp)         allocated (reuse_held), free (merge_held)
//   allocated   live map; the program holds it           held (hold), detached (count_free),
//                                                         owner_held, tc_cached (adopt),
//                                                         tc_waiting (free_deferred_adopt)
//   owner_held  live map; freed by the program, held     allocated (release_owner, which then
//               for its owner token (ledger_owners.cpp)   frees it behind a fence)
//   tc_out      live map and its cache's out set:        tc_cached (give), tc_waiting
//               handed out by a thread cache              (give_fenced), allocated (detach)
//   tc_cached   live map and its cache's bins            tc_out (take), detached (disown)
//   tc_waiting  live map and its cache's waiting list    tc_cached (fence completed),
//               or behind one of its fences               detached (disown: to the deferred list)
//   pending     the ledger's event queues or unsynced_   free (events completed), pending
//               (ledger.h)                                (one more event)
//   deferred    the ledger's deferred list or a fence    free (fence completed), pending
//               batch                                     (no fence: unsynced_)
//   retained    nowhere (after an IPC export)            spare (segment released)
//   unmapped    nowhere (expandable: no pages)           detached (grow maps it), spare
//                                                         (merged, reservation released)
//
// allocated, owner_held and tc_* are "allocated for the core"
// (is_allocated()): in the live map, counted by the segment's busy checks.
// The tc_* phases change under their cache's lock only (thread_cache.h),
// while the allocator, under its own lock, may read any block's phase, a
// neighbour's say: the field is a relaxed atomic (a plain byte load and
// store on every target), and every reader outside the cache's lock asks
// only is_allocated(), which those changes leave true.
//
// Invariants (checked by CachingAllocator::validate(), validate.cpp, one
// named check each):
//  * A segment is one device allocation [base, base+size).  Its blocks tile
//    it exactly: head->ptr == base, b->next->ptr == b->ptr + b->size, the
//    last block ends at base+size, and prev/next link both ways.
//  * A block is in exactly one phase (above).  Nothing is detached between
//    calls.  A free block is in its bin and every block in a bin is free.
//  * A (non-expandable) segment holding a retained block also holds an
//    allocated or pending block: once neither is left the whole segment goes
//    back to the driver, which keeps exported memory alive for importers.
//    Retained blocks of expandable segments stay mapped until the context
//    dies.
//  * A block's pending_events is exactly the number of entries naming it in
//    the ledger's lists of waiting frees (ledger.h: event queues, unsynced,
//    the deferred list, fence batches): more than 0 when pending, exactly 1
//    when deferred, 0 otherwise; and those lists name only blocks of live
//    segments (blocks are recycled: a stale entry would complete the next
//    new block early).
//  * No two neighbouring blocks are both free: free() merges them.
//  * Every block of a segment carries the segment's stream and pool; a free
//    block is reused on another stream only after that stream was made to
//    wait on the device for an event recorded on the block's stream, or once
//    an event recorded there after the block became free (gc_stamp) was
//    seen complete (steal_path.cpp); the steal then either moves the whole
//    segment to it or lends the block, recording the borrower in
//    stream_uses until its free.
//  * Expandable segments (expandable_segments:true) are one virtual
//    reservation whose blocks may be unmapped: an unmapped block is page-
//    aligned and never next to another unmapped block.  Reserved bytes count
//    mapped pages only.
//  * Tags (pause_path.cpp): a segment belongs to one tag, and every block of
//    a tagged segment to that tag, because a tagged request searches only its
//    tag's bins and grows only its tag's segments.  Tagged segments are
//    always expandable-style reservations.  While its tag is paused a page
//    of a mapped block may be released (paused[i]: handles[i] == 0, the
//    block stays mapped in its phase); such pages count in no reserved
//    bytes, and resume maps exactly them again.
//  * Owner-held blocks (ledger_owners.cpp): in the live map, listed in
//    exactly their owner token's ledger entry, and their bytes sum to
//    capture_held_bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>
#if CACHALLOC_DEBUG
#include <source_location>
#endif

#include "debug_assert.h"
#include "types.h"

namespace cachalloc {

struct Segment;
class StreamBins;
struct ThreadCache;

// The phases of the table above (in this order: is_allocated() and
// is_free() test ranges).  (BlockState, stats.h, is the snapshot's
// coarser view: allocated, pending free, inactive, unmapped.)
enum class BlockPhase : std::uint8_t {
  spare,
  detached,
  free,
  held,
  allocated,
  owner_held,
  tc_out,
  tc_cached,
  tc_waiting,
  pending,
  deferred,
  retained,
  unmapped,
};
inline constexpr int kNumBlockPhases = 13;

const char* block_phase_name(BlockPhase p);  // validate.cpp

namespace detail {
constexpr std::uint16_t bit(BlockPhase p) { return static_cast<std::uint16_t>(1u << static_cast<unsigned>(p)); }
}  // namespace detail

// The table above as bitmasks: kPhaseNext[from] has bit `to` set when
// from -> to is allowed.
inline constexpr std::uint16_t kPhaseNext[kNumBlockPhases] = {
    /* spare */ detail::bit(BlockPhase::detached),
    /* detached */
    static_cast<std::uint16_t>(detail::bit(BlockPhase::free) | detail::bit(BlockPhase::allocated) |
                               detail::bit(BlockPhase::pending) | detail::bit(BlockPhase::deferred) |
                               detail::bit(BlockPhase::retained) | detail::bit(BlockPhase::unmapped) |
                               detail::bit(BlockPhase::spare)),
    /* free */ detail::bit(BlockPhase::detached),
    /* held */ static_cast<std::uint16_t>(detail::bit(BlockPhase::allocated) | detail::bit(BlockPhase::free)),
    /* allocated */
    static_cast<std::uint16_t>(detail::bit(BlockPhase::held) | detail::bit(BlockPhase::detached) |
                               detail::bit(BlockPhase::owner_held) | detail::bit(BlockPhase::tc_cached) |
                               detail::bit(BlockPhase::tc_waiting)),
    /* owner_held */ detail::bit(BlockPhase::allocated),
    /* tc_out */
    static_cast<std::uint16_t>(detail::bit(BlockPhase::tc_cached) | detail::bit(BlockPhase::tc_waiting) |
                               detail::bit(BlockPhase::allocated)),
    /* tc_cached */ static_cast<std::uint16_t>(detail::bit(BlockPhase::tc_out) | detail::bit(BlockPhase::detached)),
    /* tc_waiting */
    static_cast<std::uint16_t>(detail::bit(BlockPhase::tc_cached) | detail::bit(BlockPhase::detached)),
    /* pending */ static_cast<std::uint16_t>(detail::bit(BlockPhase::free) | detail::bit(BlockPhase::pending)),
    /* deferred */ static_cast<std::uint16_t>(detail::bit(BlockPhase::free) | detail::bit(BlockPhase::pending)),
    /* retained */ detail::bit(BlockPhase::spare),
    /* unmapped */ static_cast<std::uint16_t>(detail::bit(BlockPhase::detached) | detail::bit(BlockPhase::spare)),
};

constexpr bool phase_change_allowed(BlockPhase from, BlockPhase to) {
  return (kPhaseNext[static_cast<unsigned>(from)] & detail::bit(to)) != 0;
}

// Cache-line aligned: blocks of two threads' caches, allocated one after the
// other, would otherwise share a line that both write on every pair.
struct alignas(64) Block {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;   // client's size while allocated
  StreamId stream = 0;         // stream whose pool the block returns to
  Segment* segment = nullptr;
  Block* prev = nullptr;       // neighbour at lower address, same segment
  Block* next = nullptr;       // neighbour at higher address, same segment
  int pending_events = 0;      // entries naming it in the lists of waiting frees (pending, deferred)
  bool exported = false;       // an IPC handle describes it (while allocated)
  std::uint64_t id = 0;        // allocation serial (while allocated), unique per allocator
  // Its pool's lookup count when it last became free (entered a bin, or was
  // held): garbage collection's age, and the clock of cross-stream marks
  // (steal_path.cpp, idle reuse), which move the count on.
  std::uint64_t gc_stamp = 0;
  std::vector<StreamId> stream_uses;  // streams recorded with record_stream()
  // Links of the free-block bin (free_index.h) while free; of the
  // deferred-free list or a fence's batch while deferred (ledger_fences.cpp);
  // of a thread cache's bin or waiting list while tc_cached / tc_waiting.
  Block* free_prev = nullptr;
  Block* free_next = nullptr;
  // Thread-owned (tc_* phases, thread_cache.h): the owning thread's cache,
  // set and cleared under the allocator's and that cache's locks.
  ThreadCache* tc = nullptr;
  // Owner tokens (ledger_owners.cpp): `owner` is the token of the graph
  // captures in flight when the block was allocated (0: none); while that
  // token's ledger entry lives, the program's free holds the block for it
  // (owner_held) instead of freeing it.  A held block stays allocated for
  // the core (live map, statistics, pause and resume treat it as live), is
  // freed for the program (is_live, query), never thread-owned, and listed
  // in exactly its owner's entry.
  std::uint64_t owner = 0;
  // The phase (table above); changed only through set_phase().
  std::atomic<BlockPhase> phase_{BlockPhase::spare};

  BlockPhase phase() const { return phase_.load(std::memory_order_relaxed); }
  bool is_split() const { return prev != nullptr || next != nullptr; }
  // Allocated for the core: in the live map (the program's, an owner's or a
  // thread cache's).
  // (The enum lists these phases, and is_free()'s, next to each other: a
  // range check is one subtraction and one compare on the hot path.)
  bool is_allocated() const {
    static_assert(static_cast<int>(BlockPhase::tc_waiting) - static_cast<int>(BlockPhase::allocated) == 4);
    return static_cast<unsigned>(phase()) - static_cast<unsigned>(BlockPhase::allocated) <= 4u;
  }
  bool is_mapped() const { return phase() != BlockPhase::unmapped; }
  // Mapped, not in use and not waiting: in a bin, held, or (for a moment,
  // under the lock) detached.  Neighbours that are free are merged.
  bool is_free() const {
    static_assert(static_cast<int>(BlockPhase::held) - static_cast<int>(BlockPhase::detached) == 2);
    return static_cast<unsigned>(phase()) - static_cast<unsigned>(BlockPhase::detached) <= 2u;
  }
};

// Every phase change.  A debug build aborts on a change the table does not
// allow, naming both phases and the caller; a release build is one store.
#if CACHALLOC_DEBUG
[[noreturn, gnu::cold, gnu::noinline]] void phase_change_failed(const Block& b, BlockPhase to,
                                                                const std::source_location& at);  // validate.cpp
inline void set_phase(Block& b, BlockPhase to, const std::source_location& at = std::source_location::current()) {
  if (!phase_change_allowed(b.phase(), to)) [[unlikely]] phase_change_failed(b, to, at);
  b.phase_.store(to, std::memory_order_relaxed);
}
#else
[[gnu::always_inline]] inline void set_phase(Block& b, BlockPhase to) {
  b.phase_.store(to, std::memory_order_relaxed);
}
#endif

struct Segment {
  DevicePtr base = 0;
  std::size_t size = 0;        // bytes of address space (the reservation, if expandable)
  StreamId stream = 0;
  bool small = false;
  Block* head = nullptr;
  // Expandable segments only: page size, and per page the physical handle
  // mapped there (0 where unmapped).  One handle backs a run of consecutive
  // pages mapped by one growth (expandable.cpp, kMaxRunBytes); run_pages[i]
  // is the run's length in pages at its first page and 0 at every other
  // page.  Runs tile the mapped pages, all pages of a run hold its handle,
  // and a run is unmapped whole.  A pause releases a tagged segment's runs
  // whole and leaves each paused page a run of 1 with handle 0; the resume
  // maps consecutive paused pages as runs again (pause_path.cpp).
  bool expandable = false;
  std::size_t page = 0;
  std::vector<MemHandle> handles;
  std::vector<std::uint32_t> run_pages;
  int retained = 0;            // retained blocks (see above)
  TagId tag = kUntagged;       // the tag of every block in it (set at creation)
  std::vector<bool> paused;    // tagged segments: pages released by a pause (see above)
  // release_remap (core/remap_release.cpp): pages whose physical memory now
  // backs another address, still mapped here until a fence shows the GPU
  // past their old uses.  No handle here, no block maps them, no grow maps
  // over them.
  std::vector<bool> retiring;
  std::size_t retiring_pages = 0;
  std::size_t paused_pages = 0;  // how many are set in `paused`
  StreamBins* bins = nullptr;  // where its free blocks are indexed (its stream's, its pool's)
};

}  // namespace cachalloc
