// caching_allocator.h — the caching core for one device context.
//
// Path of an allocation: malloc() rounds the size (size_policy.h), picks the
// small or large pool, completes any finished events (so blocks waiting on
// other streams come back), takes the best-fitting free block on the
// caller's stream and splits it if the rest is worth keeping; on a miss it
// asks the backend for a new segment, and on a device failure it runs the
// out-of-memory path (release one cached segment, retry; release all,
// retry; fail).  free() returns the block to its stream's pool, merged with
// free neighbours, or — when other streams used it — parks it until events
// recorded on those streams complete.  free_deferred() (a free with no
// stream, in a program with several) batches blocks behind one fence for
// all streams (ledger_fences.cpp).
//
// The common case reads like mimalloc's: a cached malloc is a bin lookup
// (free_index.h) and a split, a free a hash-table erase (live_map.h) and a
// merge, under an uncontended futex lock (fast_mutex.h), with no heap
// allocation and no driver call; pending events and fences are looked at
// only when the cache misses.  A loop that frees and reallocates one size
// skips even the split and the merge: the freed block is held unmerged
// until the next request takes it again (reuse_path.cpp).
//
// Rooms: the allocator owns a Front (front.h: the per-thread caches and
// their hand-over) and a Ledger (ledger.h: every block that waits — on
// events, fences, a device synchronization, an owner token — and retiring
// runs), and keeps the pools, segments and the policy.  It may touch
// everything below and the backend; of the front only its core's side, of
// the ledger only its public section, with this allocator's lock held.
// Invariants: block.h's (checked by validate(), validate.h), the rooms'
// and those beside the members below.
//
// Thread safety: every public method takes the allocator's mutex, except
// the front's hot halves (malloc_cached / free_cached hits, front.h),
// which take only the calling thread's cache lock.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "block.h"
#include "free_index.h"
#include "live_map.h"
#include "config.h"
#include "fast_mutex.h"
#include "front.h"
#include "ledger.h"
#include "observer.h"
#include "size_policy.h"
#include "address_info.h"
#include "allocator_stats.h"
#include "stats.h"
#include "tag_state.h"

namespace cachalloc {

// Thrown by validate() only (tests and debug builds); never on a client path.
struct InvariantError : std::logic_error {
  using std::logic_error::logic_error;
};

class CachingAllocator {
 public:
  // `backend` must outlive the allocator.  `device` is only a label for
  // observers and reports.
  CachingAllocator(DeviceBackend* backend, const Config& config, int device = 0);
  ~CachingAllocator();  // returns every cached segment (not live ones) to the backend
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Allocates `size` bytes for use on `stream`.  kInvalidValue for size 0,
  // kOutOfMemory after the retry path, or a backend error.
  Status malloc(DevicePtr* out, std::size_t size, StreamId stream);

  // Like malloc(), for the tag `tag` (kUntagged: malloc()): the block comes
  // from the tag's own segments (virtual reservations whatever
  // expandable_segments says), never shared with another tag.  kTagPaused
  // while the tag is paused (nothing changes).
  Status malloc_tagged(DevicePtr* out, std::size_t size, StreamId stream, TagId tag);

  // Pause and resume (pause_path.cpp).  pause(): waits for the device, copies
  // the tag's live blocks to pinned host memory when the tag asks for a
  // backup, then unmaps and releases every physical page of the tag's
  // segments (cached free blocks included); the addresses stay reserved.
  // resume(): maps new pages at the same addresses and restores the backup.
  // A second pause (resume) is a no-op: *no_op is set.  On error the tag is
  // left consistent: resume leaves it paused (and resumable); pause leaves
  // it running when it released nothing, else paused with pages still held
  // (pause again finishes, resume undoes).  kInvalidValue for kUntagged.
  Status pause(TagId tag, bool* no_op = nullptr);
  Status resume(TagId tag, bool* no_op = nullptr);
  // Where the tag's live blocks go at its pauses: nowhere, pinned host
  // memory, pageable host memory, or a file in config().pause_backup_dir
  // (through two pinned staging buffers of config().pause_backup_chunk
  // bytes).  The bool form: host or none.
  void set_tag_backup(TagId tag, BackupMode mode);
  void set_tag_backup(TagId tag, bool backup) { set_tag_backup(tag, backup ? BackupMode::host : BackupMode::none); }
  // Where the files of disk backups go from the next pause on: `dir` ("" =
  // config().pause_backup_dir), and whether they have names there (named:
  // one per live block, visible to ls and du while the tag is paused, left
  // behind if the process is killed; else one nameless file per tag,
  // docs/PAUSE.md).
  void set_backup_files(std::string dir, bool named);
  // Whether a host backup outlives the tag's resume (TagState::retain):
  // false (the default) gives its memory back at the resume.
  void set_tag_retain_backup(TagId tag, bool retain);
  // *host = where the host backup holds the bytes [ptr, ptr+size) of a live
  // block now (paused with a host backup, or retained after the resume), or
  // nullptr when no host backup holds them (untagged, no backup, a disk
  // backup, running and not retained).  kNotOwned outside every segment;
  // kInvalidValue when the range is not inside one live block.
  Status backup_pointer(DevicePtr ptr, std::size_t size, void** host) const;
  bool tag_paused(TagId tag) const;
  // Why the tag's last pause or resume failed, in words, when a status code
  // says too little (a backup file: path and errno text); "" otherwise.
  std::string tag_failure(TagId tag) const;
  // One entry per tag this allocator has seen (kUntagged excluded).
  std::vector<TagStats> tag_stats() const;

  // Returns a live block.  kNotOwned when `ptr` lies outside every segment
  // (the caller passes it on to the driver); kInvalidValue when it is inside
  // one but not the start of a live block (double free, interior pointer) —
  // and then nothing changes.
  Status free(DevicePtr ptr);

  // The per-thread caches (front.h): the shim's cached malloc and free.
  Front& front() { return front_; }

  // Like free(), but the block becomes reusable only after all work enqueued
  // so far on each of `streams` has completed (one event per stream).
  Status free_fenced(DevicePtr ptr, std::span<const StreamId> streams);

  // Like free(), for memory whose last use may be on any stream: the block
  // becomes reusable once a fence (DeviceBackend::fence_record) recorded
  // after this call completes.  Fences are batched: one is recorded when the
  // cache misses and enough frees wait (about 20 per driver event of a
  // fence), or when the waiting bytes pass deferred_bytes_limit(); their
  // completion is checked when the cache misses.  Once more than
  // Config::fence_wait_max bytes (and 20 frees) wait, the free joins them:
  // reusable at once, later work ordered after them on the device
  // (ledger_fences.cpp, bound_waiting).  Never synchronizes.
  Status free_deferred(DevicePtr ptr);
  // Bytes that may wait for a fence before one is recorded at the free.
  std::size_t deferred_bytes_limit() const { return ledger_.deferred_bytes_limit(); }

  // Marks a live block as used on `stream`: its free will wait for that stream.
  Status record_stream(DevicePtr ptr, StreamId stream);

  // Called before `stream` is destroyed: the blocks cached on it wait for the
  // work already enqueued there, because a stream created later may get the
  // same handle and would otherwise reuse them in "stream order" while the
  // destroyed stream's last kernels still run.
  Status retire_stream(StreamId stream);

  // Device progress the host saw (the shim's stream and context
  // synchronize hooks; steal_path.cpp): a point taken before the wait,
  // then, once the wait succeeded, stream_synced() for one stream's work
  // or all_synced() for the whole context's.  Blocks that became free
  // before the point are then idle on the device: another stream takes
  // them with no wait.  `mark_first` records a mark on `stream` before the
  // point, for a stream the legacy stream orders (blocking, legacy,
  // per-thread): its own synchronize need not wait for legacy work that a
  // free on it relied on, while a record on it does.  An invalid point
  // (no steal possible: reuse off, or no pool where two streams have had
  // segments; or the mark refused) reports nothing, nor does a wait that
  // failed.
  struct ProgressPoint {
    std::uint64_t below[2] = {};  // the pools' lookup counts (small, large)
    bool valid = false;
  };
  ProgressPoint progress_point(StreamId stream, bool mark_first);
  ProgressPoint context_progress_point();
  void stream_synced(StreamId stream, const ProgressPoint& point);
  void all_synced(const ProgressPoint& point);

  // Whether `ptr` lies inside a segment of this allocator (live or not).
  bool owns(DevicePtr ptr) const;
  // Describes `ptr`: kNotOwned when it lies outside every segment.
  Status query(DevicePtr ptr, AddressInfo* out) const;
  // Marks allocation `id` at `block` as exported through IPC: after its
  // free it is retained (never reused) until its whole segment can go back
  // to the driver.  kInvalidValue when that allocation is no longer live.
  Status mark_exported(DevicePtr block, std::uint64_t id);
  // The same for every live block overlapping [lo, hi), expandable segments
  // included (a dma-buf export of an address range): returns how many.
  std::size_t mark_range_exported(DevicePtr lo, DevicePtr hi);

  // Grants (or revokes) device `peer` access to every page mapped in an
  // expandable segment, now and whenever pages are mapped later: driver
  // peer access does not cover cuMemMap'ed memory.  Returns the first
  // backend error (the peer list is updated regardless).
  Status set_peer_access(int peer, bool enable);

  // The device context this allocator served has been destroyed: its
  // plain segments and events went with it, but physical pages and address
  // reservations (expandable segments) outlive contexts, so they go back
  // now.  Blocks and statistics stay as they were, for the exit report; the
  // allocator must not be used again.  Returns the first backend error.
  Status release_after_context_death();
  // Live blocks served for a stream other than `except` (the shim's
  // stream-less cuMemAlloc pseudo-stream): cuMemAllocAsync memory, which
  // the driver would keep alive across the context's destruction.
  std::size_t live_blocks_on_streams_except(StreamId except) const;
  // Whether `ptr` is the start of a live block of this allocator.
  bool is_live(DevicePtr ptr) const;
  // The start of every live (allocated, not freed) block, in no order: what
  // the program still holds when the context dies.
  std::vector<DevicePtr> live_block_addresses() const;

  // Owner tokens (ledger_owners.cpp): graph captures own the blocks freed
  // or allocated while they are in flight, as PyTorch's private pools do,
  // until every graph and executable graph made from them is gone (the
  // shim's graph registry, shim/graph_owners.h, issues the tokens).
  // open_owner: the token's ledger entry exists from now on (idempotent).
  // hold_for: the program frees live block `ptr` now, but it stays held for
  // `token` (opened here): kNotOwned / kInvalidValue as free().
  // mark_owner: live block `ptr` was allocated while `token` was current;
  // its free, while the entry lives, holds it.  release_owner: the entry
  // goes; every block held for it is freed behind a fence (graph launches
  // of any stream may still run), and its marked live blocks are plain
  // again.  Returns the bytes released.
  void open_owner(std::uint64_t token);
  Status hold_for(DevicePtr ptr, std::uint64_t token);
  Status mark_owner(DevicePtr ptr, std::uint64_t token);
  std::size_t release_owner(std::uint64_t token);
  // The live owner token of live block `ptr`, or 0.
  std::uint64_t owner_of(DevicePtr ptr) const;
  // Bytes held for owners now.
  std::size_t owner_held_bytes() const;

  // Completes pending events by waiting, then returns every whole free
  // segment to the device.
  void empty_cache();
  // empty_cache() for one tag: the tag's cached free memory (whole free
  // pages of its segments) goes back to the device, and its reservations
  // with nothing mapped; other tags and untagged memory keep their cache.
  // Nothing for a paused tag (its free pages went at the pause).
  void empty_tag_cache(TagId tag);
  // A tagged allocation that must map new device memory fails with
  // kOutOfMemory when the device would be left with less than `bytes` free
  // (torch_memory_saver's memory_margin_bytes); 0 (the default): no margin.
  void set_tag_memory_margin(std::size_t bytes);

  // Returns to the pools what completed events and fences allow, putting
  // waiting deferred frees behind a fence first (driver calls; for
  // cudaMemGetInfo, so that releasable_bytes() sees merged free blocks).
  void reclaim();

  // Bytes that empty_cache() could give back right now (free whole segments
  // plus those only waiting on events).
  std::size_t releasable_bytes() const;
  // per_process_memory_fraction * device total.
  std::size_t allowed_bytes() const { return allowed_bytes_; }

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  // Every segment and block (settles the held block first: reuse_path.cpp).
  std::vector<SegmentInfo> snapshot();
  const Config& config() const { return config_; }
  int device() const { return device_; }

  // Observers see every alloc/free/segment/oom event (observer.h).
  void set_observer(AllocatorObserver* observer);

  // Checks every invariant of block.h and recounts the statistics; throws
  // InvariantError naming the first violation (validate.cpp).
  void validate() const;

 private:
  friend class Validator;  // validate.h: one named check per invariant
  friend class Front;      // front.h says what of the core it may touch
  friend class Ledger;     // ledger.h likewise

  Status malloc_locked(DevicePtr* out, std::size_t size, StreamId stream);
  // malloc() beyond the held block's reuse, and its trace event: they take
  // over the lock malloc() holds (noinline: the common case stays lean).
  [[gnu::noinline]] Status malloc_held(DevicePtr* out, std::size_t size, StreamId stream);
  [[gnu::noinline]] Status malloc_slow(DevicePtr* out, std::size_t size, StreamId stream);
  [[gnu::noinline]] Status notify_alloc_unlock(Block* block, StreamId stream);
  Block* malloc_miss(BlockPool& pool, std::size_t size, std::size_t rounded, StreamId stream, Status* err);
  // The first steps of every free (free_path.h, inline): find the block
  // once, count it freed, apply the stream rule to the block found.
  Block* find_freed(DevicePtr ptr, Status* st);
  Block* count_free(Block* block);
  Status free_found(Block* block, std::span<const StreamId> fence_streams);
  Status free_locked(DevicePtr ptr, std::span<const StreamId> fence_streams);
  void free_used_elsewhere(Block* block, std::span<const StreamId> fence_streams);
  Status defer_live(Block* block);  // free_deferred after its lookup
  // (The held block keeps its entry but is not allocated.  Inline: every free.)
  Block* find_live(DevicePtr ptr) const {
    Block* b = live_.find(ptr);
    return b != nullptr && b->is_allocated() ? b : nullptr;
  }
  bool inside_segment(DevicePtr ptr) const;
  BlockPool& pool_for(bool small) { return small ? small_pool_ : large_pool_; }

  // Search and carve (allocation_path.cpp).
  Block* take_free_block(BlockPool& pool, std::size_t size, StreamId stream);
  // take_free_block's max_split_size rules: whether free block `b` may
  // serve a request of `size` bytes (b->size >= size).
  bool split_rules_allow(const Block* b, std::size_t size) const {
    const std::size_t max_split = config_.max_split_size;
    if (size < max_split && b->size >= max_split) return false;
    // (b->size >= size here; subtracting cannot wrap where adding could.)
    if (size >= max_split && b->size - size >= config_.max_non_split_rounding) return false;
    return true;
  }
  Block* new_segment(BlockPool& pool, std::size_t size, StreamId stream, bool is_retry, Status* err);
  Block* add_segment(Segment* segment);
  Block* obtain_block(BlockPool& pool, std::size_t size, StreamId stream, Status* err);
  Block* carve(Block* block, BlockPool& pool, std::size_t size);
  // The statistics of splitting `size` bytes off a free block, leaving a
  // free tail of `rest` bytes.
  void count_split(bool small, bool already_split, std::size_t size, std::size_t rest) {
    if (already_split) {
      // An inactive split block shrank by `size` bytes.
      stats_.inactive_split_bytes.decrease(small, static_cast<std::int64_t>(size));
    } else {
      // A whole segment became split: its tail is a new inactive split block.
      stats_.inactive_split.increase(small, 1);
      stats_.inactive_split_bytes.increase(small, static_cast<std::int64_t>(rest));
    }
  }
  void activate(Block* block, bool small, std::size_t requested);
  // Whether a free block of `block_size` bytes serving `size` leaves a tail
  // worth keeping as a block of its own.
  bool should_split(std::size_t block_size, std::size_t size, const BlockPool& pool) const {
    const std::size_t remaining = block_size - size;
    if (pool.small) return remaining >= kMinBlockSize;
    return size < config_.max_split_size && remaining > kSmallSize;
  }

  // The block held unmerged after its free (reuse_path.cpp).
  bool holdable(const Block* block) const;
  void hold(Block* block);
  void count_held_free(AllocatorStats& s, const Block* block) const;
  // stats_ as callers read them: with the held block's free counted.
  DeviceStats settled_stats() const;
  Block* reuse_held(BlockPool& pool, std::size_t rounded, std::size_t size, StreamId stream);
  bool held_is_best_fit(std::size_t size) const;
  // Every other operation that looks at free blocks calls this first.
  void settle_held() {
    if (held_ != nullptr) [[unlikely]] merge_held();
  }
  void merge_held();

  // Returning blocks (free_path.cpp).  deactivate: the ledger's one entry
  // back, for a block whose wait is over.
  void deactivate(Block* block);
  void return_to_pool(Block* block);
  std::size_t try_merge(Block* dst, Block* src, BlockPool& pool);
  void reactivate(Block* block);

  // Cross-stream reuse (steal_path.cpp): before the cache grows, another
  // stream's free block, the requesting stream ordered after the donor's
  // work on the device.
  Block* steal_block(BlockPool& pool, std::size_t size, StreamId stream);
  Block* best_fit_elsewhere(const BlockPool& pool, std::size_t size, StreamId stream,
                            std::span<const StreamId> refused, bool whole, bool* idle);
  Status order_after(StreamId waiter, StreamId donor, bool* donor_refused);
  bool wait_on_mark(StreamId waiter, const Block* b);
  bool idle_on_device(const Block* b);
  std::uint64_t idle_below(StreamId stream, int pool) const;
  void push_mark(StreamId stream, EventId recorded);
  struct StreamMarks;
  void drain_marks(StreamMarks& m, int pool, std::uint64_t stamp);
  bool mark_progress(StreamId stream);
  ProgressPoint point_now();
  bool progress_useful() const;
  void settle_marks(StreamMarks& m, const ProgressPoint& point);
  void pop_mark(StreamMarks& m);
  void drop_mark(StreamId stream);
  void drop_all_marks();
  Block* take_stolen(BlockPool& pool, Block* block, StreamId stream);
  bool unorderable(StreamId stream) const;

  // Giving memory back (release_path.cpp).
  void release_segment(Block* block);
  void free_segment(Segment* seg);
  void release_if_idle(Segment* seg);
  void retain(Block* block);
  bool release_one_cached(std::size_t size);
  void release_all_cached();
  void collect_garbage();
  void report_oom(std::size_t requested, std::size_t rounded, StreamId stream);

  // Pause and resume (pause_path.cpp; backups: pause_backup.cpp).
  TagState& tag_state(TagId tag);
  template <typename Fn>
  void for_tag_segments(TagId tag, Fn&& fn) {
    for (Segment* seg : expandable_)
      if (seg->tag == tag) fn(seg);
  }
  Status release_tag_pages(TagId tag, std::size_t* released);
  Status release_run(Segment* seg, std::size_t i);
  Status map_paused_pages(TagId tag);
  Status map_paused_range(Segment* seg, std::size_t first, std::size_t n);
  void drop_paused_range(Segment* seg, std::size_t first, std::size_t n);
  void forget_free_pages_of(TagId tag);
  Status take_backup(TagId tag, TagState& ts);
  Status restore_backup(TagState& ts);
  Status write_host_backup(TagState& ts, std::size_t total, BackupMode kind);
  Status read_host_backup(TagState& ts);
  Status write_disk_backup(TagState& ts, std::size_t total);
  Status create_backup_files(TagState& ts, std::size_t total);
  Status file_io(TagState& ts, std::size_t lo, std::size_t hi, unsigned char* buf, bool write);
  void close_backup_files(TagState& ts);
  std::string backup_dir() const;
  Status read_disk_backup(TagState& ts);
  Status ensure_staging(std::size_t total, TagState& ts);
  void drop_backup(TagState& ts);
  void release_host_buffer(TagState& ts);
  void settle_backup_after_resume(TagState& ts);
  void note_tagged_free(const Block* b);
  void free_backup_storage(TagState& ts);
  void release_orphans();
  bool tag_exported(TagId tag);

  // Expandable segments (expandable.cpp).
  Block* grow(BlockPool& pool, std::size_t size, StreamId stream, bool is_retry, Status* err);
  Segment* expandable_for(BlockPool& pool, StreamId stream, Status* err);
  Block* grow_expandable(BlockPool& pool, std::size_t size, StreamId stream, bool is_retry, Status* err);
  Status map_pages(Segment* seg, DevicePtr at, std::size_t bytes);
  Status map_run(Segment* seg, DevicePtr at, std::size_t bytes);
  Status grant_access(DevicePtr at, std::size_t bytes);
  Status grant_peers(DevicePtr at, std::size_t bytes);
  void whole_runs_within(const Segment* seg, DevicePtr* lo, DevicePtr* hi) const;
  Status set_access_of_mapped(int peer, bool enable);
  void unmap_pages(Segment* seg, DevicePtr at, std::size_t bytes);
  Block* split_off_front(Block* b, std::size_t bytes);
  // release_remap (remap_release.cpp; DetachedRun and RetiringRuns: ledger.h).
  bool retiring_block(const Block* b) const;
  bool runs_fit(const Block* b, std::size_t page) const;
  // release_remap's choice of donor blocks for one grow (plan_remap).
  struct RemapPlan {
    std::vector<Block*> donors;
    std::size_t bytes = 0;  // their runs, which leave reserved memory before the grow maps
  };
  bool plan_remap(const Segment* seg, const Block* u, std::size_t bytes, RemapPlan* plan) const;
  void merge_retired(Segment* seg, DevicePtr at);
  std::size_t unmap_free_block(Block* b, bool released = false, std::vector<DetachedRun>* detach = nullptr);
  void detach_pages(Segment* seg, DevicePtr at, std::size_t bytes, std::vector<DetachedRun>* out);
  std::size_t remap_before_new_peak(Segment* seg, Block* u, const RemapPlan& plan);
  std::size_t remap_donors(Segment* seg, DevicePtr at, const RemapPlan& plan, RetiringRuns* retiring);
  std::pair<Block*, std::size_t> grow_site(Segment* seg, std::size_t size) const;
  void retire_remapped(bool wait);
  void pages_within(const Block* b, DevicePtr* lo, DevicePtr* hi) const;
  void unmappable_runs_of(const Block* b, DevicePtr* lo, DevicePtr* hi) const;
  std::vector<std::pair<std::size_t, Block*>> unmappable_free_blocks() const;
  bool device_idle_for_unmap();
  void release_before_new_peak(std::size_t bytes);
  static std::size_t pick_runs(std::vector<std::pair<std::size_t, Block*>> runs, std::size_t excess,
                               std::size_t limit, std::vector<Block*>* picked);
  static std::size_t pick_free_run(const std::vector<std::pair<std::size_t, Block*>>& runs, std::size_t excess,
                                   std::size_t limit);
  void add_free_remnant(Block* b);
  void unmap_all_free_pages(const TagId* only = nullptr);
  bool within_tag_margin(std::size_t bytes);
  std::size_t mapped_bytes(const Segment* seg) const;
  std::size_t unmappable_bytes(const Segment* seg) const;
  std::size_t absorb(Block* dst, Block* src);

  // Events from a pool, not created per free (free_path.cpp): the ledger's
  // and the steal path's (order_after).
  EventId acquire_event(Status* err);
  void recycle_event(EventId event);

  // Sends an event when the observer records them (inline: twice per
  // malloc+free pair, almost always nobody listens).
  void notify(TraceKind kind, DevicePtr ptr, std::size_t size, StreamId stream) {
    if (observer_ != nullptr && observer_->wants_events()) [[unlikely]] send_event(kind, ptr, size, stream);
  }
  void send_event(TraceKind kind, DevicePtr ptr, std::size_t size, StreamId stream);

  // First, where the thread caches' fields were before it: the hit's reads
  // (the serial and the events flag) stay on the allocator's first line.
  Front front_;
  DeviceBackend* backend_;
  const Config config_;
  // Garbage collection on: pools count their lookups (a bool for the hot path).
  const bool gc_on_ = config_.garbage_collection_threshold > 0.0;
  const int device_;
  std::size_t allowed_bytes_ = 0;
  std::size_t device_total_ = 0;
  mutable FastMutex mutex_;

  // Block objects are recycled, not deleted: a cached malloc+free pair then
  // costs no heap call at all.
  std::vector<Block*> spare_blocks_;
  Block* make_block();
  void drop_block(Block* block);

  BlockPool small_pool_{true};
  BlockPool large_pool_{false};
  LiveMap live_;                                 // allocated blocks (and held_) by address
  // The last freed block, left unmerged with its free successor because the
  // next request is likely to carve exactly it out again (reuse_path.cpp).
  // Invariants (checked by validate()), while not null:
  //  * its phase is held (block.h): free but in no bin, in a
  //    plain (not expandable) segment that holds no retained block;
  //  * it keeps its live-map entry (find_live() skips it: not allocated), so
  //    that its reuse inserts nothing and its settling erases it;
  //  * its successor (next) is free and in its bin; its predecessor is null
  //    or not free;
  //  * stats_ still count it live (its free is counted when it is settled,
  //    count_held_free; readers get settled_stats()): for everything but
  //    reuse_held() it and its successor are one free block, so every
  //    other operation that looks at free blocks or statistics settles it
  //    first (settle_held(): the free and the merge it skipped).
  Block* held_ = nullptr;
  std::map<DevicePtr, Segment*> segments_;       // by base, for range lookups
  std::vector<Segment*> expandable_;             // expandable segments (also in segments_)
  std::size_t mapped_high_water_ = 0;            // the most bytes expandable segments had mapped
  // Every block that waits, and release_remap's retiring runs (ledger.h).
  Ledger ledger_;
  // Whether misses may take other streams' free blocks (cross_stream_reuse,
  // and the backend can order streams: kNotSupported clears it for good).
  // Whole segments only (the default) find none with expandable segments,
  // whose reservations never move: no search then.
  bool steals_possible_ = config_.cross_stream_reuse == CrossStream::blocks ||
                          (config_.cross_stream_reuse == CrossStream::segments && !config_.expandable_segments);
  // Streams the backend cannot name for order_streams (the
  // shim's pseudo-stream of plain allocations): never donors nor takers.
  // One or two entries.
  std::vector<StreamId> unorderable_;
  // Per stream, how far the device is known to have run it
  // (steal_path.cpp): its free blocks whose gc_stamp is below done[pool]
  // (0 small, 1 large) are idle, and any stream may take them with no wait.
  // Pending marks, oldest first: events recorded on the stream (a steal's
  // order, or a mark after an idle steal) not yet seen complete, each with
  // the pools' lookup counts it moved them on to (below): blocks stamped
  // below them became free before the record.  A ring: no heap call per mark.
  struct StreamMarks {
    static constexpr unsigned kMax = 8;
    std::uint64_t done[2] = {};
    unsigned head = 0;   // the oldest pending mark
    unsigned count = 0;  // pending marks
    EventId event[kMax] = {};
    std::uint64_t below[kMax][2] = {};
    unsigned at(unsigned i) const { return (head + i) % kMax; }
  };
  std::unordered_map<StreamId, StreamMarks> stream_marks_;
  // done[] for every stream at once: a whole-context synchronize
  // (all_synced) saw the device run past blocks stamped below it.
  std::uint64_t all_done_[2] = {};
  std::vector<EventId> spare_events_;
  AllocatorStats stats_;  // read as DeviceStats through stats_.get()
  AllocatorObserver* observer_ = nullptr;
  std::uint64_t next_id_ = 0;   // allocation serials (Block::id)
  std::vector<int> peers_;      // devices granted access to expandable pages
  // The tag a tagged malloc is serving, while it holds the lock (else
  // kUntagged): the miss path searches and grows that tag's segments only.
  TagId serving_tag_ = kUntagged;
  std::map<TagId, TagState> tags_;
  // Pinned staging of disk backups (pause_path.cpp): two halves of
  // staging_half_ bytes, one filled by the device while the other goes to
  // the file; kept for the next pause (pinned allocations are slow).
  void* staging_ = nullptr;
  std::size_t staging_half_ = 0;
  // Where disk backups go, set at run time (set_backup_files; "" = the
  // configuration's), and whether their files have names.
  std::string backup_dir_;
  bool backup_files_named_ = false;
  std::size_t tag_memory_margin_ = 0;  // set_tag_memory_margin
  // Physical handles a failed driver call left unreleased: released at the
  // next pause, resume or destruction (never lost).
  std::vector<MemHandle> orphans_;
  bool accumulated_reset_ = false;  // validate() can check allocated - freed == current until then
};

}  // namespace cachalloc
