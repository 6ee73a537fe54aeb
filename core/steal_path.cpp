// steal_path.cpp — cross-stream reuse: a miss takes a block another stream
// freed, ordered on the device, instead of growing the cache (issue 36).
//
// Blocks are cached per stream: a block freed on stream A is reusable at
// once on A, which runs later work after the program's last use.  Without
// more, a request on stream B that A's free blocks could serve grew the
// cache: a server of 16 threads, each allocating and freeing on its own
// stream, held 8.2x what CUDA's stream-ordered pool holds on an H200.
// That pool reuses across streams by making the requesting stream wait for
// an event recorded at the free (cudaMemPoolReuseFollowEventDependencies).
//
// Here, when a request finds nothing on its own stream, after what the
// stream's own waiting frees can give (events, fences, joins) and before
// the cache grows, it takes another stream's free memory (with
// take_free_block's max_split_size rules), after
// order_streams(B, A, e): an event recorded behind all work enqueued on A
// so far, and all work enqueued on B from now on made to wait for it, on
// the device: no host wait.  Two driver calls per steal, none anywhere
// else: the event is recorded at the steal, not at every free, so the
// cached pair's path is untouched (bench/callgrind-pair.sh).
//
// Idle reuse.  That wait orders B after all of A's queued work, not only
// after the block's last use: on a GPU (docs/BENCHMARKS.md section 8) a
// server's threads then ran in each other's shadow, at 0.7-0.9x CUDA's
// pool's requests/s.  CUDA's pool first reuses a block whose free the
// device has already passed (cudaMemPoolReuseAllowOpportunistic), with no
// dependency at all.  So the event of a steal stays as one of A's *marks*
// (a ring of up to StreamMarks::kMax per stream), and each mark moves on
// the clock that stamps blocks as they become free (the pools' lookup
// counts, Block::gc_stamp, which garbage collection ages blocks by): once
// a mark of A is seen complete (queried oldest first, then remembered),
// every block stamped below it is idle on the device and any stream takes
// it with no order and no driver call but the query (idle_on_device;
// num_idle_cross_stream_reuses).  A busy block that a pending mark already
// covers is taken after that mark: one wait, no new record, and only A's
// work up to the mark (wait_on_mark; num_marked_cross_stream_reuses).  No
// stamp of its own, so the free path pays nothing.  Idle blocks are preferred over smaller busy ones: both
// are memory the cache already holds, and only the busy one costs a wait.
// Measured on an H200
// (docs/BENCHMARKS.md section 8): with blocks lent on own streams
// (cross_stream_reuse:blocks) 84 % of steals were idle; with whole
// segments, which a stream frees just before another needs them, 1 %, and
// the waits remained what bounded the server's speed.  So the program's
// own waits count too: a cuStreamSynchronize that returned saw that
// stream's queued work run, a cuCtxSynchronize every stream's (the shim
// reports them: progress_point, stream_synced, all_synced).  Blocks freed
// before the wait began are idle, for no driver call at all.
//
// Why it is safe.  A free block in A's bins is one that A's own next
// request may reuse at once: every rule that puts it there (a free on A,
// the events of the other streams that used it completed, a fence over it
// completed or joined, the serial rule of shim/stream_order.h) makes it
// safe in A's order.  B runs its next work after everything enqueued on A
// before the steal, and so after everything A's own reuse would be ordered
// after: A's work, and through it whatever A waited for (cuStreamWaitEvent,
// and for a blocking A the legacy stream).  The event is recorded at the
// steal, not at the free, so B may also wait for A's work enqueued after
// the free: a cost in ordering, never an early reuse.  The reuse oracle of
// the unit tests (reuse_oracle.h) checks exactly this against the fake
// backend's record of which stream waited for which.
//
// What is taken (cross_stream_reuse):
//  * segments (the default): the smallest whole free segment (its one free
//    block; plain, untagged) of any other stream that holds the request
//    (idle ones, then busy donors by known progress: best_fit_elsewhere).
//    It moves to B: the segment, its block and its bins become B's, so
//    that B's later frees reuse it at once in B's order, as if B had made
//    it.  An expandable reservation (one per stream and pool) never moves.
//  * blocks: that, else the best fit among the other streams' free blocks,
//    lent: the block stays its segment's (and so A's) and is marked as
//    used on B (stream_uses, as record_stream marks it), so its free
//    records an event on B and it returns to A's bins once that event
//    completes.  Blocks whose uses span several streams thus wait for each
//    of them, as any record_stream'ed block does.  This reaches memory of
//    segments A still uses and of expandable reservations, but a lent
//    block is unusable from its free until the device has run B's work up
//    to it, and while any block waits for an event every allocation of the
//    context takes the locked path and queries events.  On a fake server
//    (tests/unit/test_cross_stream.cpp: 16 streams, 256 B - 32 MiB, 4
//    seeds) whole segments alone held 2,378 MiB whatever the device did,
//    lending too 2,162 MiB when events completed every round and 2,766 MiB
//    when every 16th (the lent blocks waiting), against 1,662 MiB for the
//    same requests on one stream and 5,848 MiB without cross-stream reuse:
//    hence segments by default.
//
// Never:
//  * an order while a graph capture is in flight: the backend refuses
//    (kNotReady), as it refuses marks.  A record on a capturing stream
//    would join the capture, and a wait on an event recorded outside it
//    breaks it; the shim refuses during any capture, as it refuses fences.
//    (An idle block needs neither, and may move: the device is past every
//    use of it);
//  * from a stream that is being or was destroyed (StreamBins::retired,
//    set by retire_stream): no event can be recorded on it, and a stream
//    created later with the same handle may hold blocks there in its own
//    order.  The flag ends when that handle's own miss reaches here;
//  * from or for a stream the backend cannot name (unorderable_: the
//    shim's pseudo-stream of plain cuMemAlloc blocks, whose requests cannot
//    wait on one stream); another thread's per-thread stream is covered by
//    a context-wide event, else one on the legacy stream
//    (shim/cuda_backend.cpp);
//  * for a tagged request (a tag's segments are its own), or with
//    cross_stream_reuse:false.
#include <algorithm>

#include "caching_allocator.h"

namespace cachalloc {

namespace {
// Blocks best_fit_elsewhere looks at per stream for a whole segment (the
// smallest first, from the request's size up): a bound on a miss's work
// where a stream holds many free fragments.
constexpr int kWholeSearchVisits = 64;

// `bins`' best fit stamped below `below` (known idle) that may be taken.
template <typename MayTake>
Block* best_idle_fit(const StreamBins& bins, std::size_t size, std::uint64_t below, MayTake&& may_take) {
  if (below == 0) return nullptr;
  return bins.best_fit_if(size, kWholeSearchVisits, [&](const Block* x) { return x->gc_stamp < below && may_take(x); });
}
}  // namespace

// A block of another stream for `size` bytes (already rounded) on `stream`,
// out of its bin and safe there, or nullptr: idle on the device (no wait),
// else ordered after its stream's work.  Each failed attempt costs at most
// the two calls of order_after; a donor the backend cannot name is passed
// over for the next best.
Block* CachingAllocator::steal_block(BlockPool& pool, std::size_t size, StreamId stream) {
  if (!steals_possible_ || serving_tag_ != kUntagged) return nullptr;
  // A miss on a handle a destroyed stream had: a live stream has it now.
  for (BlockPool* p : {&small_pool_, &large_pool_})
    if (StreamBins* own = p->blocks.find(stream); own != nullptr && own->retired) own->retired = false;
  if (unorderable(stream)) return nullptr;
  const bool lend = config_.cross_stream_reuse == CrossStream::blocks;
  std::vector<StreamId> refused;
  for (;;) {
    bool idle = false;
    Block* b = best_fit_elsewhere(pool, size, stream, refused, true, &idle);
    if (b == nullptr && lend) b = best_fit_elsewhere(pool, size, stream, refused, false, &idle);
    if (b == nullptr) return nullptr;
    if (idle) {
      ++stats_.num_idle_cross_stream_reuses;
      mark_progress(b->stream);
      return take_stolen(pool, b, stream);
    }
    if (wait_on_mark(stream, b)) {
      ++stats_.num_marked_cross_stream_reuses;
      return take_stolen(pool, b, stream);
    }
    bool donor_refused = false;
    const Status st = order_after(stream, b->stream, &donor_refused);
    if (st == kSuccess) return take_stolen(pool, b, stream);
    if (st == kNotSupported) steals_possible_ = false;
    if (!donor_refused) return nullptr;  // the requester cannot wait now (a capture, an error)
    refused.push_back(b->stream);
  }
}

// The best fit for `size` among the free blocks of every other stream's
// bins (untagged) that may give one: `whole`, the smallest whole free
// segment that can move; else the smallest block, and of two that size a
// whole segment.  A block idle on the device comes first, whatever its
// size: it costs no wait, and whichever is taken, the memory is already
// the cache's.  So where a stream's best fit is busy, its best idle fit is
// looked for too, among what is known idle (idle_below).  Of busy ones,
// the donor the device is known to have run furthest (its last
// synchronize or completed mark, on the common clock) comes first: the
// wait is for its work queued since, the least of any donor's.  *idle:
// whether the block returned is idle (asked once: no second query).
Block* CachingAllocator::best_fit_elsewhere(const BlockPool& pool, std::size_t size, StreamId stream,
                                            std::span<const StreamId> refused, bool whole, bool* idle) {
  const int pool_index = &pool == &small_pool_ ? 0 : 1;
  Block* best = nullptr;
  std::uint64_t best_progress = 0;
  Block* best_idle = nullptr;
  const auto better = [](const Block* b, const Block* than) {
    return than == nullptr || b->size < than->size || (b->size == than->size && than->is_split() && !b->is_split());
  };
  const auto may_take = [&](const Block* x) {
    return split_rules_allow(x, size) && (!whole || (!x->is_split() && !x->segment->expandable));
  };
  pool.blocks.for_each_stream([&](const StreamBins* bins) {
    const StreamId s = bins->stream();
    if (s == stream || bins->count() == 0 || bins->retired || unorderable(s) ||
        std::find(refused.begin(), refused.end(), s) != refused.end())
      return;
    Block* b = whole ? bins->best_fit_if(size, kWholeSearchVisits, may_take) : bins->best_fit(size);
    if (b == nullptr || !split_rules_allow(b, size)) return;
    if (better(b, best_idle) && idle_on_device(b)) {
      best_idle = b;
      return;
    }
    const std::uint64_t progress = idle_below(s, pool_index);  // after idle_on_device's queries
    if (better(b, best_idle))  // else nothing of this stream's beats the idle one found
      if (Block* idle = best_idle_fit(*bins, size, progress, may_take); idle != nullptr && better(idle, best_idle))
        best_idle = idle;
    if (best == nullptr || progress > best_progress || (progress == best_progress && better(b, best))) {
      best = b;
      best_progress = progress;
    }
  });
  *idle = best_idle != nullptr;
  return best_idle != nullptr ? best_idle : best;
}

// Orders all work enqueued on `waiter` from now on after all work enqueued
// on `donor` so far: one pooled event, recorded there and waited for here.
// The event then stays as the donor's mark (the wait holds the record it
// saw): once it completes, the donor's blocks freed before it are idle on
// the device.  *donor_refused: the backend cannot name `donor`.
Status CachingAllocator::order_after(StreamId waiter, StreamId donor, bool* donor_refused) {
  Status st = kSuccess;
  const EventId event = acquire_event(&st);
  if (st != kSuccess) return st;
  StreamId unnamed = 0;
  st = backend_->order_streams(waiter, donor, event, &unnamed);
  if (st == kInvalidValue) {
    *donor_refused = unnamed == donor;
    unorderable_.push_back(unnamed);
  }
  if (st != kSuccess) {
    recycle_event(event);
    return st;
  }
  push_mark(donor, event);
  return kSuccess;
}

// Orders `waiter` after the oldest pending mark of busy block `b`'s stream
// recorded after `b` became free (its below above b's gc_stamp): the wait
// is for the donor's work up to that record, not for all its work so far
// (order_after).  False, with nothing done, when no mark covers `b` or the
// wait is refused (order_after then says why).
bool CachingAllocator::wait_on_mark(StreamId waiter, const Block* b) {
  auto it = stream_marks_.find(b->stream);
  if (it == stream_marks_.end()) return false;
  const StreamMarks& m = it->second;
  const int pool = b->segment->small ? 0 : 1;
  for (unsigned i = 0; i < m.count; ++i) {
    const unsigned slot = m.at(i);
    if (m.below[slot][pool] > b->gc_stamp) return backend_->wait_event(waiter, m.event[slot]) == kSuccess;
  }
  return false;
}

// `recorded` (recorded on `stream` just now) becomes the stream's newest
// pending mark, covering every block that is free now.  With kMax marks
// pending after the completed ones left, it takes the newest's place: the
// older ones still show progress first, and the newest covers the most.
void CachingAllocator::push_mark(StreamId stream, EventId recorded) {
  StreamMarks& m = stream_marks_[stream];
  if (m.count == StreamMarks::kMax) drain_marks(m, 0, ~std::uint64_t{0});
  if (m.count == StreamMarks::kMax) recycle_event(m.event[m.at(--m.count)]);
  const unsigned slot = m.at(m.count++);
  m.event[slot] = recorded;
  // Blocks stamped from now on became free after the record.
  m.below[slot][0] = ++small_pool_.lookups;
  m.below[slot][1] = ++large_pool_.lookups;
}

// The oldest pending mark leaves the ring, its event back to the pool.
void CachingAllocator::pop_mark(StreamMarks& m) {
  recycle_event(m.event[m.head]);
  m.head = m.at(1);
  --m.count;
}

// Pending marks that completed leave the ring, oldest first (a stream
// completes them in record order), until one is not complete or a block of
// pool `pool` stamped `stamp` is covered.  One query per mark looked at.
void CachingAllocator::drain_marks(StreamMarks& m, int pool, std::uint64_t stamp) {
  while (m.count != 0 && m.done[pool] <= stamp && backend_->event_query(m.event[m.head]) == kSuccess) {
    m.done[0] = std::max(m.done[0], m.below[m.head][0]);
    m.done[1] = std::max(m.done[1], m.below[m.head][1]);
    pop_mark(m);
  }
}

// A mark on `stream` now (one event record, no wait), after an idle steal
// from it: the blocks it frees from then on become idle for the next
// steal too.  Without it, a stream that gave only idle memory would keep
// its last mark for ever.  (Marking every stream at every steal, so that
// all of them keep up, measured no faster on the GPU and cost 4x the
// driver calls per free: docs/BENCHMARKS.md section 8.)
bool CachingAllocator::mark_progress(StreamId stream) {
  if (unorderable(stream)) return false;
  Status st = kSuccess;
  const EventId event = acquire_event(&st);
  if (st != kSuccess) return false;
  if (backend_->mark_stream(event, stream) != kSuccess) {
    recycle_event(event);
    return false;
  }
  push_mark(stream, event);
  return true;
}

// Whether the device has run everything that could still use free block
// `b` of another stream: a mark of its stream recorded after the block
// became free (gc_stamp below the mark's count) was seen complete.  Marks are queried
// only while one of them could cover the block.  Whatever put the block
// in its bin made it safe in its stream's order (top of this file); a
// completed mark recorded on that stream later shows that order run past
// the block's last use, so any stream may take it at once.  An error other
// than not-ready counts as not complete: the caller orders instead.
bool CachingAllocator::idle_on_device(const Block* b) {
  const int pool = b->segment->small ? 0 : 1;
  if (b->gc_stamp < all_done_[pool]) return true;
  auto it = stream_marks_.find(b->stream);
  if (it == stream_marks_.end()) return false;
  StreamMarks& m = it->second;
  if (b->gc_stamp < m.done[pool]) return true;
  if (m.count == 0 || m.below[m.at(m.count - 1)][pool] <= b->gc_stamp) return false;  // no mark covers it
  drain_marks(m, pool, b->gc_stamp);
  return b->gc_stamp < m.done[pool];
}

// The clock's reading before a wait: blocks stamped from now on became
// free after it began (as push_mark's moves).
CachingAllocator::ProgressPoint CachingAllocator::point_now() {
  return ProgressPoint{{++small_pool_.lookups, ++large_pool_.lookups}, true};
}

// Only while a steal is possible: in a pool where two streams have had
// segments (a program of one stream pays no record at its synchronizes).
bool CachingAllocator::progress_useful() const {
  return steals_possible_ &&
         (small_pool_.blocks.stream_count() >= 2 || large_pool_.blocks.stream_count() >= 2);
}

CachingAllocator::ProgressPoint CachingAllocator::progress_point(StreamId stream, bool mark_first) {
  std::lock_guard lock(mutex_);
  if (!progress_useful() || (mark_first && !mark_progress(stream))) return {};
  return point_now();
}

CachingAllocator::ProgressPoint CachingAllocator::context_progress_point() {
  std::lock_guard lock(mutex_);
  return progress_useful() ? point_now() : ProgressPoint{};
}

// The wait that began at `point` returned: marks recorded before it are
// complete (the wait covered them), and blocks stamped below it are idle.
void CachingAllocator::settle_marks(StreamMarks& m, const ProgressPoint& point) {
  while (m.count != 0 && m.below[m.head][0] <= point.below[0]) pop_mark(m);
  for (int pool : {0, 1}) m.done[pool] = std::max(m.done[pool], point.below[pool]);
}

void CachingAllocator::stream_synced(StreamId stream, const ProgressPoint& point) {
  if (!point.valid) return;
  std::lock_guard lock(mutex_);
  settle_marks(stream_marks_[stream], point);
}

void CachingAllocator::all_synced(const ProgressPoint& point) {
  if (!point.valid) return;
  std::lock_guard lock(mutex_);
  for (auto& [stream, m] : stream_marks_) settle_marks(m, point);
  for (int pool : {0, 1}) all_done_[pool] = std::max(all_done_[pool], point.below[pool]);
}

// The stamp below which `stream`'s free blocks of pool `pool` are known to
// be idle: what a synchronize or its completed marks showed.  No query: a
// miss looks at every other stream, and asking each one's marks measured
// twice the driver calls per free on the GPU's request server for no more
// idle reuses (docs/BENCHMARKS.md section 8).
std::uint64_t CachingAllocator::idle_below(StreamId stream, int pool) const {
  std::uint64_t below = all_done_[pool];
  if (auto it = stream_marks_.find(stream); it != stream_marks_.end()) below = std::max(below, it->second.done[pool]);
  return below;
}

// A stream that is going away leaves no marks (its handle may come back
// as another stream, whose blocks its stamps do not cover anyway).
void CachingAllocator::drop_mark(StreamId stream) {
  auto it = stream_marks_.find(stream);
  if (it == stream_marks_.end()) return;
  for (unsigned i = 0; i < it->second.count; ++i) recycle_event(it->second.event[it->second.at(i)]);
  stream_marks_.erase(it);
}

void CachingAllocator::drop_all_marks() {
  for (auto& [stream, m] : stream_marks_)
    for (unsigned i = 0; i < m.count; ++i) recycle_event(m.event[m.at(i)]);
  stream_marks_.clear();
}

// The stolen block out of its bin: a whole segment moves to `stream`, any
// other block is lent (see the top of this file).
Block* CachingAllocator::take_stolen(BlockPool& pool, Block* block, StreamId stream) {
  if (gc_on_) ++pool.lookups;  // take_free_block's count
  pool.blocks.erase(block);
  ++stats_.num_cross_stream_reuses;
  Segment* seg = block->segment;
  if (!block->is_split() && !seg->expandable && seg->tag == kUntagged) {
    seg->stream = stream;
    seg->bins = pool.blocks.bins_for(stream);
    block->stream = stream;
  } else {
    block->stream_uses.push_back(stream);
  }
  return block;
}

bool CachingAllocator::unorderable(StreamId stream) const {
  return !unorderable_.empty() && std::find(unorderable_.begin(), unorderable_.end(), stream) != unorderable_.end();
}

}  // namespace cachalloc
