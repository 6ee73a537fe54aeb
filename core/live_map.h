// live_map.h — allocated blocks by address: an open-addressing hash table.
//
// Every free looks its pointer up here, so the lookup is the free path's
// first cost.  Linear probing over a power-of-two array of (address, block)
// slots, with backward-shift deletion (no tombstones, so probe sequences
// never lengthen with churn).  Grows (doubling) past half full: the only
// allocation, amortized over the inserts that filled it.
//
// Invariants: slot.key == 0 means empty (no block starts at address 0);
// every key sits at or after its home slot with no empty slot between
// (cyclically); count_ is the number of non-empty slots, <= capacity / 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "types.h"

namespace cachalloc {

struct Block;

class LiveMap {
 public:
  LiveMap() : slots_(kInitialCapacity), mask_(kInitialCapacity - 1) {}

  Block* find(DevicePtr key) const {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.block;
      if (s.key == 0) return nullptr;
    }
  }

  // `key` must not be present.
  void insert(DevicePtr key, Block* block) {
    if ((count_ + 1) * 2 > slots_.size()) [[unlikely]] grow();
    place(key, block);
    ++count_;
  }

  // Removes `key` if present; returns whether it was.
  bool erase(DevicePtr key) {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return false;
    }
    // Backward shift: pull later entries of the run into the hole unless
    // that would move one before its home slot.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      const Slot& s = slots_[j];
      if (s.key == 0) break;
      const std::size_t h = home(s.key);
      const bool movable = (j > i) ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = s;
        i = j;
      }
    }
    slots_[i] = Slot{};
    --count_;
    return true;
  }

  std::size_t size() const { return count_; }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_)
      if (s.key != 0) fn(s.key, s.block);
  }

 private:
  static constexpr std::size_t kInitialCapacity = 1024;
  struct Slot {
    DevicePtr key = 0;
    Block* block = nullptr;
  };

  std::size_t home(DevicePtr key) const {
    // Blocks are 512-byte aligned: drop the low bits, then Fibonacci hashing.
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }

  void place(DevicePtr key, Block* block) {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = Slot{key, block};
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old)
      if (s.key != 0) place(s.key, s.block);
  }

  std::vector<Slot> slots_;
  std::size_t mask_;
  std::size_t count_ = 0;
};

}  // namespace cachalloc
