// trace_ring.h — a bounded ring buffer of timestamped trace events.
//
// Keeps the newest `capacity` records.  Storage grows on demand up to the
// capacity (so a large trace_max_entries costs nothing until it is used), then
// the oldest record is overwritten and counted in dropped().  Not thread safe:
// ProcessObserver serializes access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "observer.h"

namespace cachalloc::obs {

struct TimedEvent {
  std::uint64_t ns;  // steady clock, nanoseconds
  int device;
  TraceEvent event;
};

class TraceRing {
 public:
  struct Contents {
    std::vector<TimedEvent> events;  // oldest first
    std::uint64_t dropped = 0;
    std::size_t capacity = 0;
  };

  explicit TraceRing(std::size_t capacity) : capacity_(capacity) {}

  void push(const TimedEvent& e);
  Contents contents() const;
  std::size_t size() const { return records_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::uint64_t dropped() const { return dropped_; }

 private:
  std::size_t capacity_;
  std::vector<TimedEvent> records_;
  std::size_t next_ = 0;  // slot to overwrite once full
  std::uint64_t dropped_ = 0;
};

}  // namespace cachalloc::obs
