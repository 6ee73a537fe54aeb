// free_index.h — the free blocks of one pool, found by best fit in O(1).
//
// PyTorch keeps a pool's free blocks in one ordered set keyed by (stream,
// size, address); a cached malloc+free pair then costs four tree updates.
// Here each stream has its own bins (StreamBins), two-level segregated as in
// TLSF: a size's bin is its power of two (first level) and one of 32 linear
// steps inside it (second level), and two bitmaps say which bins hold
// blocks, so the next non-empty bin is a count-trailing-zeros away.
//
// Invariants (checked by validate()):
//  * A block is in a bin exactly while its phase is free (block.h), and
//    sits in the bin bin_of(size) of its own stream's StreamBins.  insert()
//    and erase() make those phase changes (detached <-> free; a block whose
//    events or fence completed, or the held block, enters straight from
//    pending, deferred or held).
//  * A bin's list is sorted by size, ascending; among equal sizes the most
//    recently inserted comes first.  The first block of a bin is therefore
//    its smallest, and best fit is exact: the smallest free block of at
//    least the requested size on the stream (PyTorch picks the lowest
//    address among equal sizes; this index the most recently freed, as
//    rmm and mimalloc do — warmer memory, O(1) insertion).
//  * Bit s of level2[f] is set iff bin (f, s) is non-empty; bit f of level1
//    iff level2[f] != 0.
//  * A block's size does not change while it is in a bin (erase first).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <unordered_map>
#include <vector>

#include "block.h"

namespace cachalloc {

class StreamBins {
 public:
  static constexpr int kLinear = 32;   // second-level steps per power of two
  static constexpr int kLevels = 52;   // first-level bins (sizes up to 2^60)

  explicit StreamBins(StreamId stream, TagId tag = kUntagged) : stream_(stream), tag_(tag) {}
  StreamId stream() const { return stream_; }
  TagId tag() const { return tag_; }
  std::size_t count() const { return count_; }

  // Set by retire_stream (the stream is being destroyed), cleared when the
  // handle asks for memory again (a new stream got it): while set, no other
  // stream takes these blocks (steal_path.cpp), since an event cannot be
  // recorded on a destroyed stream and a new stream with the same handle
  // may use the blocks in its own order.
  bool retired = false;

  // The bin of a block of `size` bytes: sizes below 16 KiB have a bin each
  // (in 512-byte units), larger ones share one of 32 steps of their power
  // of two.
  static int bin_of(std::size_t size) {
    const std::uint64_t units = size >> 9;
    if (units < kLinear) return static_cast<int>(units);
    const int msb = 63 - std::countl_zero(units);
    int level = msb - 4;  // >= 1 here
    if (level >= kLevels) return kLevels * kLinear - 1;
    const int step = static_cast<int>((units >> (msb - 5)) & (kLinear - 1));
    return level * kLinear + step;
  }

  // The smallest block of at least `size` bytes, or nullptr.  Not removed.
  Block* best_fit(std::size_t size) const {
    const int bin = bin_of(size);
    for (Block* b = heads_[bin]; b != nullptr; b = b->free_next)
      if (b->size >= size) return b;
    return first_after(bin);
  }

  // The smallest block of at least `size` bytes for which keep(b) holds,
  // looking at `max_visits` blocks at most (smallest first), or nullptr:
  // best_fit, walking on past the blocks keep refuses (rare paths only).
  template <typename Keep>
  Block* best_fit_if(std::size_t size, int max_visits, Keep&& keep) const {
    int bin = bin_of(size);
    for (Block* b = heads_[bin]; b != nullptr && max_visits > 0; b = b->free_next)
      if (b->size >= size && (--max_visits, keep(b))) return b;
    for (Block* head = first_after(bin); head != nullptr && max_visits > 0; head = first_after(bin)) {
      bin = bin_of(head->size);
      for (Block* b = head; b != nullptr && max_visits > 0; b = b->free_next)
        if (--max_visits, keep(b)) return b;
    }
    return nullptr;
  }

  void insert(Block* b) {
    CACHALLOC_ASSERT(b->free_prev == nullptr && b->free_next == nullptr && b->tc == nullptr,
                     "a block enters a bin linked in no other list, owned by no thread cache");
    CACHALLOC_ASSERT(b->pending_events == 0 && b->size != 0, "a block enters a bin waiting for nothing");
    CACHALLOC_ASSERT(b->stream == stream_, "a block enters its own stream's bins");
    set_phase(*b, BlockPhase::free);
    const int bin = bin_of(b->size);
    Block** link = &heads_[bin];
    Block* prev = nullptr;
    while (*link != nullptr && (*link)->size < b->size) {
      prev = *link;
      link = &(*link)->free_next;
    }
    b->free_next = *link;
    b->free_prev = prev;
    if (*link != nullptr) (*link)->free_prev = b;
    *link = b;
    level2_[bin / kLinear] |= 1u << (bin % kLinear);
    level1_ |= std::uint64_t{1} << (bin / kLinear);
    ++count_;
  }

  void erase(Block* b) {
    CACHALLOC_ASSERT(b->phase() == BlockPhase::free, "only a free block is erased from a bin");
    const int bin = bin_of(b->size);
    CACHALLOC_ASSERT(b->free_prev != nullptr || heads_[bin] == b,
                     "an erased block is in the bin its size selects (its size changed in the bin?)");
    CACHALLOC_ASSERT(count_ != 0, "an erase from an empty StreamBins");
    if (b->free_prev != nullptr) b->free_prev->free_next = b->free_next;
    else heads_[bin] = b->free_next;
    if (b->free_next != nullptr) b->free_next->free_prev = b->free_prev;
    b->free_prev = b->free_next = nullptr;
    set_phase(*b, BlockPhase::detached);
    if (heads_[bin] == nullptr) {
      level2_[bin / kLinear] &= ~(1u << (bin % kLinear));
      if (level2_[bin / kLinear] == 0) level1_ &= ~(std::uint64_t{1} << (bin / kLinear));
    }
    --count_;
  }

  // Calls fn(Block*) for every block, smallest first; fn must not change
  // the index (collect first).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (int bin = 0; bin < kLevels * kLinear; ++bin)
      for (Block* b = heads_[bin]; b != nullptr; b = b->free_next) fn(b);
  }

  // For validate(): whether `b` is linked in the bin its size selects, and
  // that bin's order and bitmaps are right.  Returns a violation or nullptr.
  const char* check(const Block* b) const;

 private:
  Block* first_after(int bin) const {
    const int level = bin / kLinear;
    const int step = bin % kLinear;
    const std::uint32_t rest = step + 1 < kLinear ? level2_[level] & (~0u << (step + 1)) : 0;
    if (rest != 0) return heads_[level * kLinear + std::countr_zero(rest)];
    const std::uint64_t higher = level + 1 < 64 ? level1_ & (~std::uint64_t{0} << (level + 1)) : 0;
    if (higher == 0) return nullptr;
    const int l = std::countr_zero(higher);
    return heads_[l * kLinear + std::countr_zero(level2_[l])];
  }

  StreamId stream_;
  TagId tag_;
  std::size_t count_ = 0;
  std::uint64_t level1_ = 0;
  std::uint32_t level2_[kLevels] = {};
  Block* heads_[kLevels * kLinear] = {};
};

// All streams' bins of one pool.  StreamBins are created on a stream's
// first segment and kept (segments point at them).  Tagged segments have
// bins of their own per (stream, tag), kept apart from the untagged ones
// (which alone use the one-entry cache `last_`): a tagged request searches
// only its tag's bins, so blocks of two tags never meet.
class FreeIndex {
 public:
  // The bins of `stream`, created on first use.
  StreamBins* bins_for(StreamId stream) {
    if (last_ != nullptr && last_->stream() == stream) [[likely]] return last_;
    auto& slot = by_stream_[stream];
    if (!slot) slot = std::make_unique<StreamBins>(stream);
    last_ = slot.get();
    return last_;
  }
  // The bins of `stream` if it has any, for lookups that must not create.
  StreamBins* find(StreamId stream) const {
    if (last_ != nullptr && last_->stream() == stream) return last_;
    auto it = by_stream_.find(stream);
    return it == by_stream_.end() ? nullptr : it->second.get();
  }

  Block* best_fit(StreamId stream, std::size_t size) {
    StreamBins* bins = find(stream);
    return bins == nullptr ? nullptr : bins->best_fit(size);
  }
  // fn(StreamBins*) for every stream's untagged bins (cross-stream reuse,
  // steal_path.cpp: one best-fit lookup per stream, on misses that would
  // grow the cache only).
  template <typename Fn>
  void for_each_stream(Fn&& fn) const {
    for (const auto& [stream, bins] : by_stream_) fn(bins.get());
  }
  // The same for a tagged request (tag != kUntagged).
  StreamBins* tagged_bins_for(StreamId stream, TagId tag) {
    auto& slot = by_tag_[{stream, tag}];
    if (!slot) slot = std::make_unique<StreamBins>(stream, tag);
    return slot.get();
  }
  const StreamBins* find_tagged(StreamId stream, TagId tag) const {
    auto it = by_tag_.find({stream, tag});
    return it == by_tag_.end() ? nullptr : it->second.get();
  }
  Block* best_fit_tagged(StreamId stream, TagId tag, std::size_t size) const {
    const StreamBins* bins = find_tagged(stream, tag);
    return bins == nullptr ? nullptr : bins->best_fit(size);
  }
  void insert(Block* b) {
    b->segment->bins->insert(b);
    ++count_;
  }
  void erase(Block* b) {
    b->segment->bins->erase(b);
    --count_;
  }
  std::size_t size() const { return count_; }
  // Streams that have had untagged segments in this pool.
  std::size_t stream_count() const { return by_stream_.size(); }

  // Every free block (rare paths: release, garbage collection, reports).
  std::vector<Block*> all() const {
    std::vector<Block*> out;
    out.reserve(count_);
    for (const auto& [stream, bins] : by_stream_) bins->for_each([&](Block* b) { out.push_back(b); });
    for (const auto& [key, bins] : by_tag_) bins->for_each([&](Block* b) { out.push_back(b); });
    return out;
  }
  // The free blocks of one stream (every tag's).
  std::vector<Block*> on_stream(StreamId stream) const {
    std::vector<Block*> out;
    if (const StreamBins* bins = find(stream)) bins->for_each([&](Block* b) { out.push_back(b); });
    for (const auto& [key, bins] : by_tag_)
      if (key.first == stream) bins->for_each([&](Block* b) { out.push_back(b); });
    return out;
  }
  const StreamBins* bins_of(StreamId stream, TagId tag = kUntagged) const {
    return tag == kUntagged ? find(stream) : find_tagged(stream, tag);
  }

 private:
  std::unordered_map<StreamId, std::unique_ptr<StreamBins>> by_stream_;
  std::map<std::pair<StreamId, TagId>, std::unique_ptr<StreamBins>> by_tag_;  // tagged segments' bins
  mutable StreamBins* last_ = nullptr;
  std::size_t count_ = 0;
};

// One pool (small or large): its free blocks and the garbage-collection clock.
struct BlockPool {
  explicit BlockPool(bool is_small) : small(is_small) {}
  FreeIndex blocks;           // free blocks, best fit per stream
  const bool small;
  // take_free_block calls (with garbage collection on) and cross-stream
  // marks (steal_path.cpp): the clock of Block::gc_stamp.
  std::uint64_t lookups = 0;
};

}  // namespace cachalloc
