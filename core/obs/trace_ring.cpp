// trace_ring.cpp — see trace_ring.h.
#include "trace_ring.h"

namespace cachalloc::obs {

void TraceRing::push(const TimedEvent& e) {
  if (capacity_ == 0) {
    ++dropped_;
    return;
  }
  if (records_.size() < capacity_) {
    records_.push_back(e);
    return;
  }
  records_[next_] = e;  // overwrite the oldest
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

TraceRing::Contents TraceRing::contents() const {
  Contents c;
  c.dropped = dropped_;
  c.capacity = capacity_;
  c.events.reserve(records_.size());
  // Once full, next_ is the oldest record; before that it is 0.
  for (std::size_t i = 0; i < records_.size(); ++i) c.events.push_back(records_[(next_ + i) % records_.size()]);
  return c;
}

}  // namespace cachalloc::obs
