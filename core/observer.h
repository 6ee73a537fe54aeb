// observer.h — what the core tells the outside world about itself.
//
// The core calls an AllocatorObserver (if one is installed) for every event a
// timeline wants, and fills an OomReport when an allocation finally fails.
// Observers are called with the allocator's lock held: they must not call
// back into the allocator, and must be cheap (the trace ring buffer is).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "types.h"

namespace cachalloc {

enum class TraceKind : std::uint8_t { alloc, free, segment_map, segment_unmap, oom, empty_cache };

struct TraceEvent {
  TraceKind kind;
  DevicePtr ptr;                 // block or segment address (0 for oom/empty_cache)
  std::size_t size;              // bytes (requested size for oom)
  StreamId stream;
  std::int64_t allocated_bytes;  // allocated_bytes.all.current after the event
  std::int64_t reserved_bytes;   // reserved_bytes.all.current after the event
};

struct OomReport {
  std::size_t requested = 0;           // bytes the client asked for
  std::size_t rounded = 0;             // after rounding
  std::size_t device_total = 0;        // from the backend's mem_info
  std::size_t device_free = 0;         // driver's free memory at the failure
  std::size_t allowed = 0;             // per_process_memory_fraction * total
  std::size_t allocated = 0;           // bytes handed to the program
  std::size_t reserved = 0;            // bytes cachalloc holds in segments
  std::size_t largest_free_block = 0;  // largest cached free block
  std::size_t tag_margin = 0;          // a tagged request's memory margin (set_tag_memory_margin), else 0
  StreamId stream = 0;
};

class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual void on_event(int device, const TraceEvent& event) = 0;
  virtual void on_oom(int device, const OomReport& report) = 0;
  // Whether on_event wants events now: one relaxed load, so that the
  // allocator's hot path neither builds nor sends events nobody records.
  bool wants_events() const { return events_on_ == nullptr || events_on_->load(std::memory_order_relaxed); }
  // The flag wants_events() reads (nullptr: events always wanted).
  const std::atomic<bool>* events_flag() const { return events_on_; }

 protected:
  // Set by an observer whose interest can change (nullptr: always).
  const std::atomic<bool>* events_on_ = nullptr;
};

// A copy of the allocator's state for snapshots (see snapshot()).
enum class BlockState : std::uint8_t { allocated, pending_free, inactive, unmapped };

struct BlockInfo {
  DevicePtr ptr;
  std::size_t size;
  std::size_t requested;  // 0 for inactive blocks
  BlockState state;
  StreamId stream;
};

struct SegmentInfo {
  DevicePtr base;
  std::size_t size;
  StreamId stream;
  bool small_pool;
  bool expandable = false;        // a virtual reservation grown by mapping pages
  std::vector<BlockInfo> blocks;  // in address order
  TagId tag = kUntagged;          // pause_path.cpp
  std::size_t paused_bytes = 0;   // pages released by a pause of its tag
};

}  // namespace cachalloc
