// fake_backend.h — a DeviceBackend for tests and benchmarks, no GPU needed.
//
// Hands out disjoint address ranges from a fake device of `total` bytes
// (addresses only, no memory behind them), counts every call, keeps events
// pending until the test completes them, and fails the next N segment
// allocations on request — like rmm's limiting upstream or harfbuzz's
// failing allocator.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <stdexcept>

#include "backend.h"

namespace cachalloc::testing {

class FakeBackend final : public DeviceBackend {
 public:
  explicit FakeBackend(std::size_t total = 80 * GiB) : total_(total) {}

  // ---- knobs for tests ----
  void fail_next_allocs(int n) { fail_next_ = n; }
  // Makes N event_record calls fail (driver error 999), after `after` more succeed.
  void fail_next_records(int n, int after = 0) {
    fail_records_ = n;
    records_before_failing_ = after;
  }
  // Events complete only when the test says so, unless auto-complete is on.
  void set_auto_complete(bool on) { auto_complete_ = on; }
  void complete_all_events() {
    for (auto& [id, ev] : events_) ev.done = true;
  }
  void complete_events_on(StreamId stream) {
    for (auto& [id, ev] : events_)
      if (ev.recorded && ev.stream == stream) ev.done = true;
  }
  // Sets the memory that someone else holds on the device.
  void set_foreign_usage(std::size_t bytes) { foreign_ = bytes; }

  // ---- observations ----
  std::size_t used() const { return used_; }
  std::size_t live_segments() const { return segments_.size(); }
  int alloc_calls = 0, free_calls = 0, failed_allocs = 0;
  int device_syncs = 0;
  int event_creates = 0, event_records = 0, event_queries = 0, event_syncs = 0, event_destroys = 0;
  std::size_t live_events() const { return events_.size(); }
  bool has_segment(DevicePtr p) const { return segments_.count(p) != 0; }

  // ---- DeviceBackend ----
  Status segment_alloc(std::size_t size, DevicePtr* out) override {
    ++alloc_calls;
    if (fail_next_ > 0) {
      --fail_next_;
      ++failed_allocs;
      return kOutOfMemory;
    }
    if (size == 0) return kInvalidValue;
    if (used_ + foreign_ + size > total_) {
      ++failed_allocs;
      return kOutOfMemory;
    }
    *out = next_addr_;
    next_addr_ += (size + 0xFFFF) & ~std::size_t{0xFFFF};  // never reuse addresses: stale pointers stay detectable
    next_addr_ += 0x10000;                                  // gap so adjacent segments never touch
    segments_[*out] = size;
    used_ += size;
    return kSuccess;
  }
  Status segment_free(DevicePtr ptr) override {
    ++free_calls;
    auto it = segments_.find(ptr);
    if (it == segments_.end()) throw std::logic_error("FakeBackend: segment_free of an unknown pointer");
    used_ -= it->second;
    segments_.erase(it);
    return kSuccess;
  }
  Status mem_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    *free_bytes = total_ - used_ - foreign_;
    *total_bytes = total_;
    return kSuccess;
  }
  Status event_create(EventId* out) override {
    ++event_creates;
    *out = next_event_++;
    events_[*out] = Event{};
    return kSuccess;
  }
  Status event_record(EventId e, StreamId stream) override {
    ++event_records;
    if (fail_records_ > 0 && records_before_failing_-- <= 0) {
      --fail_records_;
      return 999;
    }
    auto& ev = get(e);
    ev.recorded = true;
    ev.stream = stream;
    ev.done = auto_complete_;
    return kSuccess;
  }
  Status event_query(EventId e) override {
    ++event_queries;
    return get(e).done ? kSuccess : kNotReady;
  }
  Status event_synchronize(EventId e) override {
    ++event_syncs;
    get(e).done = true;
    return kSuccess;
  }
  Status event_destroy(EventId e) override {
    ++event_destroys;
    events_.erase(e);
    return kSuccess;
  }
  // A fence is the base class's event on stream 0, unless refused (as the
  // shim's backend refuses one while a graph capture is in flight).  It
  // reports `fence_events` events, as the shim's would with that many
  // streams alive (one event on stream 0 stands for all of them here).
  void refuse_fences(bool on) { refuse_fences_ = on; }
  int fence_records = 0;
  int fence_events = 1;
  Status fence_record(FenceId* out, FenceCost* cost) override {
    if (refuse_fences_) return kNotReady;
    ++fence_records;
    const Status st = DeviceBackend::fence_record(out, cost);
    if (st == kSuccess) cost->events = fence_events;
    return st;
  }
  Status synchronize_device() override {
    ++device_syncs;
    complete_all_events();
    return kSuccess;
  }
  Status vm_granularity(std::size_t* out) override {
    *out = 2 * MiB;
    return kSuccess;
  }
  // Virtual memory: reservations are address ranges; each created handle
  // is device memory (counts in used()); a map must land inside a
  // reservation on an unmapped, granule-aligned range.
  Status vm_reserve(std::size_t size, DevicePtr* out) override {
    next_addr_ = (next_addr_ + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);  // granule-aligned like the driver's
    *out = next_addr_;
    next_addr_ += size + 0x10000;
    reservations_[*out] = size;
    return kSuccess;
  }
  Status vm_release_range(DevicePtr base, std::size_t size) override {
    auto it = reservations_.find(base);
    if (it == reservations_.end() || it->second != size) throw std::logic_error("FakeBackend: bad vm_release_range");
    for (auto& [at, h] : mappings_)
      if (at >= base && at < base + size) throw std::logic_error("FakeBackend: releasing a range still mapped");
    reservations_.erase(it);
    return kSuccess;
  }
  Status vm_create(std::size_t size, MemHandle* out) override {
    ++alloc_calls;
    if (fail_next_ > 0) {
      --fail_next_;
      ++failed_allocs;
      return kOutOfMemory;
    }
    if (used_ + foreign_ + size > total_) {
      ++failed_allocs;
      return kOutOfMemory;
    }
    *out = next_handle_++;
    handles_[*out] = size;
    used_ += size;
    return kSuccess;
  }
  Status vm_release(MemHandle h) override {
    ++free_calls;
    auto it = handles_.find(h);
    if (it == handles_.end()) throw std::logic_error("FakeBackend: vm_release of an unknown handle");
    used_ -= it->second;
    handles_.erase(it);
    return kSuccess;
  }
  Status vm_map(DevicePtr at, std::size_t size, MemHandle h) override {
    if (handles_.count(h) == 0 || handles_[h] != size) throw std::logic_error("FakeBackend: vm_map of a bad handle");
    if (at % (2 * MiB) != 0) throw std::logic_error("FakeBackend: vm_map not granule-aligned");
    auto r = reservations_.upper_bound(at);
    if (r == reservations_.begin() || at + size > std::prev(r)->first + std::prev(r)->second)
      throw std::logic_error("FakeBackend: vm_map outside any reservation");
    if (!mappings_.emplace(at, h).second) throw std::logic_error("FakeBackend: vm_map over a mapping");
    return kSuccess;
  }
  Status vm_unmap(DevicePtr at, std::size_t size) override {
    if (mappings_.erase(at) == 0) throw std::logic_error("FakeBackend: vm_unmap of an unmapped address");
    for (auto& [device, pages] : peer_access_)
      for (DevicePtr p = at; p < at + size; p += 2 * MiB) pages.erase(p);
    return kSuccess;
  }
  // Peer access is recorded per 2 MiB granule; a range must be mapped.
  Status vm_set_access(DevicePtr at, std::size_t size, int device, bool enable) override {
    if (fail_next_access_ > 0) {
      --fail_next_access_;
      return kInvalidValue;
    }
    for (DevicePtr p = at; p < at + size; p += 2 * MiB) {
      if (mappings_.upper_bound(p) == mappings_.begin()) throw std::logic_error("FakeBackend: access to unmapped memory");
      if (enable) peer_access_[device].insert(p);
      else peer_access_[device].erase(p);
    }
    return kSuccess;
  }
  // Whether `device` was granted access to the granule holding `p`.
  bool peer_can_access(int device, DevicePtr p) const {
    auto it = peer_access_.find(device);
    return it != peer_access_.end() && it->second.count(p - p % (2 * MiB)) != 0;
  }
  void fail_next_access(int n) { fail_next_access_ = n; }
  std::size_t live_mappings() const { return mappings_.size(); }
  std::size_t live_reservations() const { return reservations_.size(); }

 private:
  struct Event {
    bool recorded = false;
    bool done = false;
    StreamId stream = 0;
  };
  Event& get(EventId e) {
    auto it = events_.find(e);
    if (it == events_.end()) throw std::logic_error("FakeBackend: unknown event");
    return it->second;
  }

  std::size_t total_;
  std::size_t used_ = 0;
  std::size_t foreign_ = 0;
  int fail_next_ = 0;
  int fail_records_ = 0;
  int records_before_failing_ = 0;
  bool refuse_fences_ = false;
  bool auto_complete_ = false;
  DevicePtr next_addr_ = 0x7f0000000000;
  EventId next_event_ = 1;
  std::map<DevicePtr, std::size_t> segments_;
  std::map<EventId, Event> events_;
  std::map<DevicePtr, std::size_t> reservations_;
  std::map<MemHandle, std::size_t> handles_;
  std::map<DevicePtr, MemHandle> mappings_;
  MemHandle next_handle_ = 1;
  std::map<int, std::set<DevicePtr>> peer_access_;
  int fail_next_access_ = 0;
};

}  // namespace cachalloc::testing
