// node_arena.h — a free-list memory resource for small container nodes.
//
// The pools (std::set) and the live-block map allocate one node per insert.
// Through malloc that is the largest cost of a cached malloc+free pair, and
// libstdc++'s pmr pool resource is slower still; this arena keeps one free
// list per 16-byte size class, carves new nodes from 4 KiB slabs, and never
// returns memory until it is destroyed.  Not thread-safe: each allocator
// uses it under its own mutex.
#pragma once

#include <array>
#include <cstddef>
#include <memory_resource>
#include <new>
#include <vector>

namespace cachalloc {

class NodeArena final : public std::pmr::memory_resource {
 public:
  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  ~NodeArena() override {
    for (void* slab : slabs_) ::operator delete(slab);
  }

 private:
  static constexpr std::size_t kGranule = 16;
  static constexpr std::size_t kClasses = 8;  // nodes up to 128 bytes
  static constexpr std::size_t kSlabBytes = 4096;
  struct FreeNode {
    FreeNode* next;
  };

  static std::size_t size_class(std::size_t bytes) { return (bytes + kGranule - 1) / kGranule - 1; }

  void* do_allocate(std::size_t bytes, std::size_t align) override {
    const std::size_t c = size_class(bytes);
    if (c >= kClasses || align > kGranule) return ::operator new(bytes, std::align_val_t{align});
    if (free_[c] == nullptr) refill(c);
    FreeNode* n = free_[c];
    free_[c] = n->next;
    return n;
  }

  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    const std::size_t c = size_class(bytes);
    if (c >= kClasses || align > kGranule) {
      ::operator delete(p, std::align_val_t{align});
      return;
    }
    auto* n = static_cast<FreeNode*>(p);
    n->next = free_[c];
    free_[c] = n;
  }

  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  void refill(std::size_t c) {
    const std::size_t node = (c + 1) * kGranule;
    auto* slab = static_cast<char*>(::operator new(kSlabBytes));
    slabs_.push_back(slab);
    for (std::size_t off = 0; off + node <= kSlabBytes; off += node) {
      auto* n = reinterpret_cast<FreeNode*>(slab + off);
      n->next = free_[c];
      free_[c] = n;
    }
  }

  std::array<FreeNode*, kClasses> free_{};
  std::vector<void*> slabs_;
};

}  // namespace cachalloc
