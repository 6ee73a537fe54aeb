// block.h — blocks, segments and the pools that index free blocks.
//
// Invariants (checked by CachingAllocator::validate()):
//  * A segment is one device allocation [base, base+size).  Its blocks tile
//    it exactly: head->ptr == base, b->next->ptr == b->ptr + b->size, the
//    last block ends at base+size, and prev/next link both ways.
//  * A block is in exactly one state: allocated (in the live-block map),
//    pending (freed, waiting for pending_events events), retained (freed
//    after an IPC export: never reused while its segment lives, because an
//    importer may still map it; in no pool), or free (in its segment's pool,
//    indexed by stream and size, free_index.h).
//  * A (non-expandable) segment holding a retained block also holds an
//    allocated or pending block: once neither is left the whole segment goes
//    back to the driver, which keeps exported memory alive for importers.
//    Retained blocks of expandable segments stay mapped until the context
//    dies.
//  * A pending block's pending_events is exactly the number of entries
//    naming it in the lists of waiting frees (event queues, unsynced, the
//    deferred list, fence batches), and those lists name only blocks of
//    live segments (blocks are recycled: a stale entry would complete the
//    next new block early).
//  * No two neighbouring blocks are both free: free() merges them.
//  * Every block of a segment carries the segment's stream and pool; a free
//    block is reused on another stream only after that stream was made to
//    wait on the device for an event recorded on the block's stream
//    (steal_path.cpp), which then either moves the whole segment to it or
//    lends the block, recording the borrower in stream_uses until its free.
//  * Expandable segments (expandable_segments:true) are one virtual
//    reservation whose blocks may be unmapped: an unmapped block is page-
//    aligned, never allocated, in no pool, and never next to another
//    unmapped block.  Reserved bytes count mapped pages only.
//  * Tags (pause_path.cpp): a segment belongs to one tag, and every block of
//    a tagged segment to that tag, because a tagged request searches only its
//    tag's bins and grows only its tag's segments.  Tagged segments are
//    always expandable-style reservations.  While its tag is paused a page
//    of a mapped block may be released (paused[i]: handles[i] == 0, the
//    block stays mapped in its state); such pages count in no reserved
//    bytes, and resume maps exactly them again.
//  * Owner-held blocks (owner_ledger.cpp): allocated, in the live map, not
//    thread-owned, listed in exactly their owner token's ledger entry, and
//    their bytes sum to capture_held_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "types.h"

namespace cachalloc {

struct Segment;
class StreamBins;
struct ThreadCache;

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
  bool allocated = false;
  bool mapped = true;          // false only for unmapped ranges of expandable segments
  int pending_events = 0;      // events to complete before the block is free
  bool exported = false;       // an IPC handle describes it (while allocated)
  bool retained = false;       // freed after an export: kept out of reuse
  std::uint64_t id = 0;        // allocation serial (while allocated), unique per allocator
  std::uint64_t gc_stamp = 0;  // pool's lookup count when the block became free
  std::vector<StreamId> stream_uses;  // streams recorded with record_stream()
  // Links of the free-block bin (free_index.h) while in_pool; of the
  // deferred-free list or a fence's batch while deferred (fence_path.cpp).
  Block* free_prev = nullptr;
  Block* free_next = nullptr;
  bool in_pool = false;
  bool deferred = false;       // freed, waiting for a fence (counted in pending_events)
  // Thread-owned (thread_cache.h): the owning thread's cache, set and
  // cleared under the allocator's and that cache's locks; tc_live (under the
  // cache's lock) says whether the program holds it (handed out again) or
  // freed it (cached).  A thread-owned block keeps allocated set.
  ThreadCache* tc = nullptr;
  bool tc_live = false;
  // Freed by its owner under the fence rule (tc_live false): waiting in its
  // cache for a fence, not in a bin (thread_cache.h, "Fenced frees").
  bool tc_waiting = false;
  // Owner tokens (owner_ledger.cpp): `owner` is the token of the graph
  // captures in flight when the block was allocated (0: none); while that
  // token's ledger entry lives, the program's free holds the block for it
  // (owner_held) instead of freeing it.  A held block stays allocated for
  // the core (live map, statistics, pause and resume treat it as live), is
  // freed for the program (is_live, query), never thread-owned, and listed
  // in exactly its owner's entry.
  std::uint64_t owner = 0;
  bool owner_held = false;

  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool is_free() const { return mapped && !allocated && pending_events == 0 && !retained; }
};

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
