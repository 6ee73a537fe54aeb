// fake_backend.h — a DeviceBackend for tests and benchmarks, no GPU needed.
//
// Hands out disjoint address ranges from a fake device of `total` bytes
// (addresses only, no memory behind them), counts every call, keeps events
// pending until the test completes them, and fails the next N segment
// allocations on request — like rmm's limiting upstream or harfbuzz's
// failing allocator.
//
// Fences are modelled as the shim records them (shim/cuda_backend.cpp): an
// event on the legacy stream, and for each non-blocking stream the test
// declared, a stream query, plus an event when the test marked it busy; the
// fake counts the queries so that tests can hold the allocator's fence
// statistics to them.  A logical clock orders records, fences and device
// synchronizations, so that a test can ask whether the device has *shown*
// (through an event, a fence or a synchronization the allocator could see)
// that work enqueued before some moment completed: stream_done_after() and
// device_done_after(), the oracle of the reuse-safety checks.
//
// Backup copies (copy_to_host_async / copy_to_device_async) are
// asynchronous as on a GPU: they move their bytes at copy_synchronize() or
// a device synchronization, and releasing either side before that throws.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

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
    for (auto& [id, ev] : events_) mark_done(ev);
    note_fences();
  }
  void complete_events_on(StreamId stream) {
    for (auto& [id, ev] : events_)
      if (ev.recorded && ev.stream == stream) mark_done(ev);
    note_fences();
  }
  // The program waited for `stream` (cuStreamSynchronize): its work so far
  // completed, so did whatever it had waited for and the events recorded
  // on it.
  void program_synchronized(StreamId stream) {
    complete_events_on(stream);
    Event now;
    now.recorded = true;
    now.stream = stream;
    now.at = ++clock_;
    if (auto it = order_.find(stream); it != order_.end()) now.covers = it->second;
    mark_done(now);
  }
  // The program waited for the whole device (cuCtxSynchronize): as
  // synchronize_device, but not the allocator's (device_syncs unchanged).
  void program_synchronized_all() {
    const int syncs = device_syncs;
    synchronize_device();
    device_syncs = syncs;
  }
  // Sets the memory that someone else holds on the device.
  void set_foreign_usage(std::size_t bytes) { foreign_ = bytes; }

  // ---- observations ----
  std::size_t used() const { return used_; }
  // The most device memory held at once (physical: a handle counts until
  // its last mapping goes).
  std::size_t peak_used() const { return peak_used_; }
  std::size_t live_segments() const { return segments_.size(); }
  int alloc_calls = 0, free_calls = 0, failed_allocs = 0;
  int own_access_calls = 0;  // vm_set_own_access
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
    peak_used_ = std::max(peak_used_, used_);
    return kSuccess;
  }
  Status segment_free(DevicePtr ptr) override {
    ++free_calls;
    auto it = segments_.find(ptr);
    if (it == segments_.end()) throw std::logic_error("FakeBackend: segment_free of an unknown pointer");
    used_ -= it->second;
    segment_contents_.erase(it->first);
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
    ev.at = ++clock_;
    ev.done = false;
    // Its completion shows whatever the stream waited for done too
    // (mark_done): the record runs after those waits on the device.
    if (auto it = order_.find(stream); it != order_.end()) ev.covers = it->second;
    else ev.covers.clear();
    if (auto_complete_) {
      mark_done(ev);
      note_fences();
    }
    return kSuccess;
  }
  Status event_query(EventId e) override {
    ++event_queries;
    return get(e).done ? kSuccess : kNotReady;
  }
  Status event_synchronize(EventId e) override {
    ++event_syncs;
    mark_done(get(e));
    note_fences();
    return kSuccess;
  }
  Status event_destroy(EventId e) override {
    ++event_destroys;
    events_.erase(e);
    return kSuccess;
  }
  // ---- fences (as the shim's: an event on the legacy stream, and per
  // non-blocking stream a query, plus an event when it is busy) ----
  void refuse_fences(bool on) { refuse_fences_ = on; }
  // Declares a live non-blocking stream (a fence covers it), idle or busy.
  void add_nonblocking_stream(StreamId s, bool busy = false) { nonblocking_[s] = busy; }
  void set_stream_busy(StreamId s, bool busy) { nonblocking_.at(s) = busy; }
  void remove_nonblocking_stream(StreamId s) { nonblocking_.erase(s); }
  int fence_records = 0;        // fences recorded (successfully or not)
  int fence_event_records = 0;  // events the fences recorded (legacy stream included)
  int stream_queries = 0;       // non-blocking streams the fences asked whether they were idle
  std::size_t live_fences() const { return fences_.size(); }
  Status fence_record(FenceId* out, FenceCost* cost) override {
    if (refuse_fences_) return kNotReady;
    ++fence_records;
    Fence f{++clock_, {}};
    Status st = fence_event(&f, 0);
    for (auto it = nonblocking_.begin(); st == kSuccess && it != nonblocking_.end(); ++it) {
      ++stream_queries;
      if (it->second) st = fence_event(&f, it->first);
    }
    if (st != kSuccess) {
      for (EventId e : f.events) event_destroy(e);
      return st;
    }
    *out = next_fence_++;
    *cost = FenceCost{.events = static_cast<int>(f.events.size()),
                      .stream_queries = static_cast<int>(nonblocking_.size())};
    fences_[*out] = f;
    note_fences();
    return kSuccess;
  }
  Status fence_query(FenceId fence) override {
    for (EventId e : get_fence(fence).events)
      if (event_query(e) != kSuccess) return kNotReady;
    return kSuccess;
  }
  Status fence_synchronize(FenceId fence) override {
    for (EventId e : get_fence(fence).events) event_synchronize(e);
    return kSuccess;
  }
  void fence_destroy(FenceId fence) override {
    for (EventId e : get_fence(fence).events) event_destroy(e);
    fences_.erase(fence);
  }
  // Joins (cuCtxWaitEvent in the shim) are refused as unsupported unless a
  // test allows them, so that the fence tests written before them keep
  // testing what they test.
  void allow_joins(bool on) { joins_allowed_ = on; }
  int fence_joins = 0;
  bool fence_join_supported() const override { return joins_allowed_; }
  Status fence_join(FenceId fence) override {
    if (!joins_allowed_) return kNotSupported;
    if (refuse_fences_) return kNotReady;
    ++fence_joins;
    joined_at_ = std::max(joined_at_, get_fence(fence).at);
    return kSuccess;
  }

  // ---- cross-stream ordering (order_streams, core/steal_path.cpp) ----
  // Each stream has a vector clock: order_[w][d] > t means that all work
  // enqueued on w from now on runs after all work enqueued on d before tick
  // t + 1, because w waited for an event recorded on d after t, directly or
  // through the waits of other streams.  order_streams records the event on
  // the donor (a snapshot of the donor's clock, with the donor itself at
  // the record's tick) and merges it into the waiter's clock.  Refused with
  // kNotReady while refuse_fences() (a capture, as the shim refuses both)
  // or refuse_orders() is on.
  void refuse_orders(bool on) { refuse_orders_ = on; }
  void orders_unsupported(bool on) { orders_unsupported_ = on; }
  // A stream the backend cannot name (the shim's plain-allocation pseudo-stream).
  void unnameable(StreamId s) { unnameable_.insert(s); }
  int order_records = 0, order_waits = 0;  // (one each per order_streams that ordered)
  int order_refusals = 0;  // calls answered kInvalidValue (a stream it cannot name)
  struct OrderWait {
    StreamId waiter;
    StreamId donor;      // the stream the event was recorded on
    EventId event;
    std::uint64_t recorded_at;  // the record's tick
    std::uint64_t at;           // the wait's tick
  };
  std::vector<OrderWait> order_log;  // every wait, in order
  Status order_streams(StreamId waiter, StreamId donor, EventId e, StreamId* unnamed) override {
    if (orders_unsupported_) return kNotSupported;
    for (StreamId s : {waiter, donor})
      if (unnameable_.count(s) != 0) return ++order_refusals, *unnamed = s, kInvalidValue;
    if (refuse_orders_ || refuse_fences_) return kNotReady;
    ++order_records;
    auto& ev = get(e);
    ev.recorded = true;
    ev.stream = donor;
    ev.at = ++clock_;
    ev.done = false;
    ev.covers = order_[donor];
    ev.covers[donor] = ev.at;
    wait_for(waiter, e);
    return kSuccess;
  }
  // A progress mark: a plain record, refused as order_streams is.
  int mark_records = 0;
  Status mark_stream(EventId e, StreamId stream) override {
    if (orders_unsupported_) return kNotSupported;
    if (unnameable_.count(stream) != 0) return kInvalidValue;
    if (refuse_orders_ || refuse_fences_) return kNotReady;
    ++mark_records;
    return event_record(e, stream);
  }
  // A wait on a mark recorded earlier: the waiter's clock takes the
  // record's snapshot (covers, and the marked stream at the record's tick).
  int mark_waits = 0;
  Status wait_event(StreamId waiter, EventId e) override {
    if (orders_unsupported_) return kNotSupported;
    if (unnameable_.count(waiter) != 0) return kInvalidValue;
    if (refuse_orders_ || refuse_fences_) return kNotReady;
    if (!get(e).recorded) return kInvalidValue;
    ++mark_waits;
    wait_for(waiter, e);
    return kSuccess;
  }
  // `waiter`'s clock takes recorded event `e`'s: what it covers, and its
  // own stream up to the record's tick; logged as a wait.
  void wait_for(StreamId waiter, EventId e) {
    const Event& ev = get(e);
    ++order_waits;
    auto merge = [&](StreamId s, std::uint64_t t) {
      std::uint64_t& mine = order_[waiter][s];
      mine = std::max(mine, t);
    };
    for (const auto& [s, t] : ev.covers) merge(s, t);
    merge(ev.stream, ev.at);
    order_log.push_back({waiter, ev.stream, e, ev.at, ++clock_});
  }
  // Whether all work enqueued on `waiter` from now on runs after all work
  // enqueued on `donor` before tick t + 1 (see above).
  bool stream_ordered_after(StreamId waiter, StreamId donor, std::uint64_t t) const {
    auto w = order_.find(waiter);
    if (w == order_.end()) return false;
    auto d = w->second.find(donor);
    return d != w->second.end() && d->second > t;
  }

  // ---- what the device has shown complete ----
  // The clock: each event record, fence and device synchronization takes
  // the next tick.  Read it just before a free; work enqueued before the
  // free is enqueued before tick now()+1.
  std::uint64_t now() const { return clock_; }
  // Whether the device has shown that all work enqueued on `stream` before
  // tick t+1 completed: an event recorded on it after t is done, or the
  // device was synchronized after t.
  bool stream_done_after(StreamId stream, std::uint64_t t) const {
    auto it = stream_done_at_.find(stream);
    return device_synced_at_ > t || (it != stream_done_at_.end() && it->second > t);
  }
  // Whether it has shown that all work on every stream enqueued before tick
  // t+1 completed: a fence recorded after t is complete, or the device was
  // synchronized after t.
  bool device_done_after(std::uint64_t t) const { return device_synced_at_ > t || fence_done_at_ > t; }
  // Whether all work enqueued from now on, on every stream, is ordered
  // after all work enqueued before tick t+1: a fence recorded after t was
  // joined (fence_join).
  bool device_ordered_after(std::uint64_t t) const { return joined_at_ > t; }

  // Work in flight: kernels the test says may still use memory the program
  // freed (launch_work).  cuMemUnmap does not wait for them (as cuMemFree
  // does), and on a GPU they would fault, so vm_unmap throws until the
  // device has shown them complete: a synchronization, or a fence recorded
  // after them that completed.
  void launch_work() {
    work_in_flight_ = true;
    launched_at_ = clock_;
  }
  // A kernel using [at, at+bytes) only: vm_unmap of pages in that range
  // throws until the device has shown it complete (as for launch_work),
  // while other ranges may be unmapped.  For workloads that keep kernels
  // running on some blocks while others are given back.
  void launch_work_on(DevicePtr at, std::size_t bytes) { ranged_launches_.push_back({clock_, at, bytes}); }
  Status synchronize_device() override {
    if (fault()) return 999;
    ++device_syncs;
    work_in_flight_ = false;
    drain_copies();  // cuCtxSynchronize waits for the copy stream too
    device_synced_at_ = ++clock_;
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
    if (fault()) return kOutOfMemory;
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
    peak_used_ = std::max(peak_used_, used_);
    return kSuccess;
  }
  // As cuMemRelease: the memory goes once no address maps it (a release
  // while mapped takes effect at the last unmap).
  Status vm_release(MemHandle h) override {
    if (fault()) return 999;
    ++free_calls;
    if (handles_.count(h) == 0 || released_.count(h) != 0)
      throw std::logic_error("FakeBackend: vm_release of an unknown handle");
    released_.insert(h);
    drop_if_unmapped(h);
    return kSuccess;
  }
  // Addresses that map `h` (release_remap maps a handle at two).
  int mappings_of(MemHandle h) const {
    int n = 0;
    for (const auto& [at, m] : mappings_) n += m == h;
    return n;
  }
  Status vm_map(DevicePtr at, std::size_t size, MemHandle h) override {
    if (fault()) return 999;
    if (handles_.count(h) == 0 || released_.count(h) != 0 || handles_[h] != size) throw std::logic_error("FakeBackend: vm_map of a bad handle");
    if (at % (2 * MiB) != 0) throw std::logic_error("FakeBackend: vm_map not granule-aligned");
    auto r = reservations_.upper_bound(at);
    if (r == reservations_.begin() || at + size > std::prev(r)->first + std::prev(r)->second)
      throw std::logic_error("FakeBackend: vm_map outside any reservation");
    if (!mappings_.emplace(at, h).second) throw std::logic_error("FakeBackend: vm_map over a mapping");
    return kSuccess;
  }
  // As cuMemUnmap: whole mappings only (a run of pages is one mapping).
  Status vm_unmap(DevicePtr at, std::size_t size) override {
    if (fault()) return 999;
    if (work_in_flight_ && !device_done_after(launched_at_))
      throw std::logic_error("FakeBackend: vm_unmap while kernels may still use the pages");
    for (const Copy& c : in_flight_)
      if (c.dev < at + size && at < c.dev + c.n)
        throw std::logic_error("FakeBackend: vm_unmap of pages a copy in flight still uses (no copy_synchronize before)");
    std::erase_if(ranged_launches_, [&](const RangedLaunch& l) { return device_done_after(l.at); });
    for (const RangedLaunch& l : ranged_launches_)
      if (l.ptr < at + size && at < l.ptr + l.bytes)
        throw std::logic_error("FakeBackend: vm_unmap of pages a running kernel uses");
    auto m = mappings_.find(at);
    if (m == mappings_.end()) throw std::logic_error("FakeBackend: vm_unmap of an unmapped address");
    for (DevicePtr p = at; p < at + size; p += handles_.at(m->second)) {
      m = mappings_.find(p);
      if (m == mappings_.end() || p + handles_.at(m->second) > at + size)
        throw std::logic_error("FakeBackend: vm_unmap of part of a mapping");
    }
    for (DevicePtr p = at; p < at + size;) {
      m = mappings_.find(p);
      const MemHandle h = m->second;
      p += handles_.at(h);
      mappings_.erase(m);
      drop_if_unmapped(h);
    }
    for (auto& [device, pages] : peer_access_)
      for (DevicePtr p = at; p < at + size; p += 2 * MiB) pages.erase(p);
    for (DevicePtr p = at; p < at + size; p += 2 * MiB) own_access_.erase(p);
    return kSuccess;
  }
  // A mapping starts inaccessible (as cuMemMap's): reading or writing it
  // throws until this grants the device access.  May span mappings.
  Status vm_set_own_access(DevicePtr at, std::size_t size) override {
    if (fault()) return 999;
    ++own_access_calls;
    for (DevicePtr p = at; p < at + size; p += 2 * MiB) {
      if (!mapped(p)) throw std::logic_error("FakeBackend: access to unmapped memory");
      own_access_.insert(p);
    }
    return kSuccess;
  }
  bool own_access(DevicePtr p) const { return own_access_.count(p - p % (2 * MiB)) != 0; }
  // Peer access is recorded per 2 MiB granule; a range must be mapped.
  Status vm_set_access(DevicePtr at, std::size_t size, int device, bool enable) override {
    if (fail_next_access_ > 0) {
      --fail_next_access_;
      return kInvalidValue;
    }
    for (DevicePtr p = at; p < at + size; p += 2 * MiB) {
      if (!mapped(p)) throw std::logic_error("FakeBackend: access to unmapped memory");
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

  // ---- memory contents, host memory and copies (pause backups) ----
  // Device memory behind mapped pages is modelled byte for byte (lazily,
  // per physical handle): write/read go through the mappings, so touching
  // an unmapped (paused) address throws, and a new handle reads as zeros.
  void write(DevicePtr p, const void* src, std::size_t n) { access(p, const_cast<void*>(src), n, true); }
  void read(DevicePtr p, void* dst, std::size_t n) { access(p, dst, n, false); }
  Status host_alloc(std::size_t size, void** out) override {
    if (fault()) return kOutOfMemory;
    *out = new unsigned char[size];
    ++live_host_;
    host_sizes_[*out] = size;
    live_host_bytes_ += size;
    peak_host_bytes_ = std::max(peak_host_bytes_, live_host_bytes_);
    return kSuccess;
  }
  void host_free(void* p) override {
    check_no_copy_on_host(p, host_sizes_.count(p) != 0 ? host_sizes_.at(p) : 1, "host_free of a buffer");
    delete[] static_cast<unsigned char*>(p);
    --live_host_;
    live_host_bytes_ -= host_sizes_.at(p);
    host_sizes_.erase(p);
  }
  // Pageable backups (BackupMode::pageable): real anonymous mappings
  // (DeviceBackend's), counted and failed on cue like host_alloc.
  Status pageable_alloc(std::size_t size, void** out) override {
    if (fault()) return kOutOfMemory;
    const Status st = DeviceBackend::pageable_alloc(size, out);
    if (st != kSuccess) return st;
    pageable_sizes_[*out] = size;
    return kSuccess;
  }
  void pageable_free(void* p, std::size_t size) override {
    check_no_copy_on_host(p, size, "pageable_free of a buffer");
    if (pageable_sizes_.count(p) == 0 || pageable_sizes_.at(p) != size)
      throw std::logic_error("FakeBackend: pageable_free of a buffer not allocated, or with another size");
    pageable_sizes_.erase(p);
    DeviceBackend::pageable_free(p, size);
  }
  std::size_t live_pageable() const { return pageable_sizes_.size(); }
  std::size_t live_pageable_bytes() const {
    std::size_t n = 0;
    for (const auto& [p, size] : pageable_sizes_) n += size;
    return n;
  }
  // Copies are asynchronous, as on a GPU: a copy is queued and moves its
  // bytes only when copy_synchronize() (or a device synchronization) waits
  // for it.  Until then the destination holds its old bytes, and anything
  // that would pull memory from under a copy in flight throws: unmapping
  // device pages it reads or writes, freeing its host buffer, writing its
  // host destination to a file or reading a file into its host source.
  // So code that releases pages before the backup copy finished, or reads
  // a backup that is not there yet, fails here as it would corrupt data on
  // a GPU.  Default on: correct code waits before it touches either side;
  // set_async_copies(false) gives the old immediate copies.
  void set_async_copies(bool on) {
    if (!on) drain_copies();
    async_copies_ = on;
  }
  std::size_t copies_in_flight() const { return in_flight_.size(); }
  Status copy_to_host_async(void* dst, DevicePtr src, std::size_t n) override {
    if (fault()) return 999;
    ++copies;
    ops += 'H';
    if (async_copies_) in_flight_.push_back({true, dst, src, n});
    else read(src, dst, n);
    return kSuccess;
  }
  Status copy_to_device_async(DevicePtr dst, const void* src, std::size_t n) override {
    if (fault()) return 999;
    ++copies;
    ops += 'D';
    if (async_copies_) in_flight_.push_back({false, const_cast<void*>(src), dst, n});
    else write(dst, src, n);
    return kSuccess;
  }
  // The copies complete whether or not the wait reports an error (a failed
  // cuStreamSynchronize leaves no copy running that the caller must chase).
  Status copy_synchronize() override {
    drain_copies();
    if (fault()) return 999;
    ops += 'S';
    return kSuccess;
  }
  int copies = 0;
  // The backup traffic in order: H copy to host, D copy to device, S copy
  // synchronize, W file write, R file read (a test clears it).
  std::string ops;
  int live_host() const { return live_host_; }
  std::size_t live_host_bytes() const { return live_host_bytes_; }
  std::size_t peak_host_bytes() const { return peak_host_bytes_; }
  void reset_peak_host_bytes() { peak_host_bytes_ = live_host_bytes_; }

  // ---- backup files (disk backups of paused tags) ----
  // Real files through DeviceBackend's POSIX calls, counted, and failed on
  // cue: each is in fail_call_at()'s count, and fail_file_write(n) /
  // fail_file_read(n) fail the n-th (0-based) write / read from now once,
  // as a full disk (ENOSPC) or an I/O error (EIO) would.
  Status file_create(const char* dir, std::uint64_t size, int* fd, std::string* why, std::string* name) override {
    if (fault()) return injected(why, "create: No space left on device (injected)");
    const Status st = DeviceBackend::file_create(dir, size, fd, why, name);
    if (st == kSuccess) {
      ++files_created;
      open_files_.insert(*fd);
      peak_open_files = std::max(peak_open_files, open_files_.size());
    }
    return st;
  }
  Status file_open(const std::string& path, int* fd, std::string* why) override {
    if (fault()) return injected(why, "open: Too many open files (injected)");
    const Status st = DeviceBackend::file_open(path, fd, why);
    if (st == kSuccess) {
      open_files_.insert(*fd);
      peak_open_files = std::max(peak_open_files, open_files_.size());
    }
    return st;
  }
  Status file_write(int fd, const void* src, std::size_t size, std::uint64_t offset, std::string* why) override {
    if (open_files_.count(fd) == 0) throw std::logic_error("FakeBackend: write to a file not open");
    if (fault() || (fail_write_at_ >= 0 && fail_write_at_-- == 0)) return injected(why, "write: No space left on device (injected)");
    check_no_copy_on_host(src, size, "file_write from a buffer");
    ++file_writes;
    ops += 'W';
    file_bytes_written += size;
    return DeviceBackend::file_write(fd, src, size, offset, why);
  }
  Status file_read(int fd, void* dst, std::size_t size, std::uint64_t offset, std::string* why) override {
    if (open_files_.count(fd) == 0) throw std::logic_error("FakeBackend: read from a file not open");
    if (fault() || (fail_read_at_ >= 0 && fail_read_at_-- == 0)) return injected(why, "read: Input/output error (injected)");
    check_no_copy_on_host(dst, size, "file_read into a buffer");
    ++file_reads;
    ops += 'R';
    return DeviceBackend::file_read(fd, dst, size, offset, why);
  }
  void file_close(int fd) override {
    if (open_files_.erase(fd) == 0) throw std::logic_error("FakeBackend: closing a file not open");
    DeviceBackend::file_close(fd);
  }
  void fail_file_write(int n) { fail_write_at_ = n; }
  void fail_file_read(int n) { fail_read_at_ = n; }
  std::size_t open_files() const { return open_files_.size(); }
  int files_created = 0, file_writes = 0, file_reads = 0;
  std::size_t peak_open_files = 0;  // the most files open at once
  std::size_t file_bytes_written = 0;
  std::size_t live_handles() const { return handles_.size(); }

  // Fault injection over the calls of pause and resume: synchronize_device,
  // vm_create/map/unmap/release/set_own_access, host_alloc, pageable_alloc and the copies.  The call `n`
  // (0-based) from now fails once; calls_seen() counts them.
  void fail_call_at(int n) {
    fault_at_ = n;
    calls_seen_ = 0;
  }
  int calls_seen() const { return calls_seen_; }
  bool fault_fired() const { return fault_fired_; }
  std::size_t live_mappings() const { return mappings_.size(); }
  // Whether `p` lies in a mapping.
  bool mapped(DevicePtr p) const {
    auto m = mappings_.upper_bound(p);
    if (m == mappings_.begin()) return false;
    --m;
    return p < m->first + handles_.at(m->second);
  }
  std::size_t live_reservations() const { return reservations_.size(); }

 private:
  struct Event {
    bool recorded = false;
    bool done = false;
    StreamId stream = 0;
    std::uint64_t at = 0;  // the tick of its last record
    std::map<StreamId, std::uint64_t> covers;  // order_streams' snapshot of the donor's clock
  };
  struct Fence {
    std::uint64_t at = 0;
    std::vector<EventId> events;  // the legacy stream's first
  };
  Event& get(EventId e) {
    auto it = events_.find(e);
    if (it == events_.end()) throw std::logic_error("FakeBackend: unknown event");
    return it->second;
  }
  Fence& get_fence(FenceId f) {
    auto it = fences_.find(f);
    if (it == fences_.end()) throw std::logic_error("FakeBackend: unknown fence");
    return it->second;
  }
  // A fence's event on `stream`, created and recorded as the shim does.
  Status fence_event(Fence* f, StreamId stream) {
    EventId e = 0;
    Status st = event_create(&e);
    if (st != kSuccess) return st;
    st = event_record(e, stream);
    if (st != kSuccess) {
      event_destroy(e);
      return st;
    }
    ++fence_event_records;
    f->events.push_back(e);
    return kSuccess;
  }
  // Done: all work on its stream before its record has completed, and so
  // all work of other streams that its stream had waited for by then
  // (covers: a stream that waited on an event runs after that event's work).
  void mark_done(Event& ev) {
    ev.done = true;
    if (!ev.recorded) return;
    std::uint64_t& at = stream_done_at_[ev.stream];
    at = std::max(at, ev.at);
    for (const auto& [s, t] : ev.covers) {
      std::uint64_t& other = stream_done_at_[s];
      other = std::max(other, t);
    }
  }
  // A fence whose events are all done has shown every stream complete up to it.
  void note_fences() {
    for (const auto& [id, f] : fences_)
      if (std::all_of(f.events.begin(), f.events.end(), [&](EventId e) { return get(e).done; }))
        fence_done_at_ = std::max(fence_done_at_, f.at);
  }

  static Status injected(std::string* why, const char* what) {
    if (why != nullptr) *why = std::string("backup file ") + what;
    return kOperatingSystem;
  }
  // A copy in flight (async_copies_): host <-> [dev, dev+n).
  struct Copy {
    bool to_host;
    void* host;
    DevicePtr dev;
    std::size_t n;
  };
  void drain_copies() {
    std::vector<Copy> todo;
    todo.swap(in_flight_);
    for (const Copy& c : todo)
      if (c.to_host) read(c.dev, c.host, c.n);
      else write(c.dev, c.host, c.n);
  }
  // (While a failed test unwinds, its fixture's destructors free host
  // buffers: the copies in flight are then dropped, so the first failure
  // is reported instead of std::terminate.)
  void check_no_copy_on_host(const void* p, std::size_t n, const char* what) {
    if (std::uncaught_exceptions() > 0) {
      in_flight_.clear();
      return;
    }
    const auto* lo = static_cast<const unsigned char*>(p);
    for (const Copy& c : in_flight_) {
      const auto* h = static_cast<const unsigned char*>(c.host);
      if (h < lo + n && lo < h + c.n)
        throw std::logic_error(std::string("FakeBackend: ") + what + " a copy in flight still uses (no copy_synchronize before)");
    }
  }

  bool fault() {
    const bool hit = fault_at_ >= 0 && calls_seen_ == fault_at_;
    ++calls_seen_;
    if (hit) {
      fault_at_ = -1;
      fault_fired_ = true;
    }
    return hit;
  }
  void access(DevicePtr p, void* buf, std::size_t n, bool to_device) {
    auto* bytes = static_cast<unsigned char*>(buf);
    while (n > 0) {
      auto seg = segments_.upper_bound(p);  // a plain segment (segment_alloc)?
      if (seg != segments_.begin() && p < std::prev(seg)->first + std::prev(seg)->second) {
        --seg;
        auto& data = segment_contents_[seg->first];
        if (data.empty()) data.assign(seg->second, 0);
        const std::size_t off = p - seg->first;
        if (off + n > seg->second) throw std::logic_error("FakeBackend: access past a segment");
        if (to_device) std::copy(bytes, bytes + n, data.begin() + static_cast<std::ptrdiff_t>(off));
        else std::copy(data.begin() + static_cast<std::ptrdiff_t>(off), data.begin() + static_cast<std::ptrdiff_t>(off + n), bytes);
        return;
      }
      auto m = mappings_.upper_bound(p);
      if (m == mappings_.begin()) throw std::logic_error("FakeBackend: access to unmapped memory");
      --m;
      const std::size_t len = handles_.at(m->second);
      if (p >= m->first + len) throw std::logic_error("FakeBackend: access to unmapped memory");
      if (!own_access(p)) throw std::logic_error("FakeBackend: access to a mapping without vm_set_own_access");
      auto& data = contents_[m->second];
      if (data.empty()) data.assign(len, 0);
      const std::size_t off = p - m->first;
      const std::size_t k = std::min(n, len - off);
      if (to_device) std::copy(bytes, bytes + k, data.begin() + static_cast<std::ptrdiff_t>(off));
      else std::copy(data.begin() + static_cast<std::ptrdiff_t>(off), data.begin() + static_cast<std::ptrdiff_t>(off + k), bytes);
      p += k;
      bytes += k;
      n -= k;
    }
  }

  bool async_copies_ = true;
  std::vector<Copy> in_flight_;
  int fault_at_ = -1;
  int calls_seen_ = 0;
  bool fault_fired_ = false;
  int live_host_ = 0;
  std::map<void*, std::size_t> host_sizes_;
  std::map<void*, std::size_t> pageable_sizes_;
  std::size_t live_host_bytes_ = 0, peak_host_bytes_ = 0;
  std::set<int> open_files_;
  int fail_write_at_ = -1, fail_read_at_ = -1;  // counted down by each write / read
  std::map<MemHandle, std::vector<unsigned char>> contents_;
  std::map<DevicePtr, std::vector<unsigned char>> segment_contents_;
  std::size_t total_;
  std::size_t used_ = 0;
  std::size_t peak_used_ = 0;
  std::size_t foreign_ = 0;
  int fail_next_ = 0;
  int fail_records_ = 0;
  int records_before_failing_ = 0;
  bool refuse_fences_ = false;
  bool refuse_orders_ = false;
  bool orders_unsupported_ = false;
  std::set<StreamId> unnameable_;
  std::map<StreamId, std::map<StreamId, std::uint64_t>> order_;  // order_[waiter][donor] (see order_streams)
  bool joins_allowed_ = false;
  std::uint64_t joined_at_ = 0;
  bool auto_complete_ = false;
  bool work_in_flight_ = false;  // launch_work() since the last synchronize_device
  std::uint64_t launched_at_ = 0;  // the clock at the last launch_work()
  struct RangedLaunch {
    std::uint64_t at;  // the clock at launch_work_on()
    DevicePtr ptr;
    std::size_t bytes;
  };
  std::vector<RangedLaunch> ranged_launches_;
  DevicePtr next_addr_ = 0x7f0000000000;
  EventId next_event_ = 1;
  std::map<DevicePtr, std::size_t> segments_;
  std::map<EventId, Event> events_;
  std::map<StreamId, bool> nonblocking_;  // live non-blocking streams: busy?
  std::map<FenceId, Fence> fences_;
  FenceId next_fence_ = 1;
  std::uint64_t clock_ = 0;
  std::uint64_t device_synced_at_ = 0;          // the last synchronize_device
  std::uint64_t fence_done_at_ = 0;             // the latest fence seen complete
  std::map<StreamId, std::uint64_t> stream_done_at_;  // the latest event seen done, per stream
  std::map<DevicePtr, std::size_t> reservations_;
  std::map<MemHandle, std::size_t> handles_;
  std::set<MemHandle> released_;  // released, still mapped somewhere
  void drop_if_unmapped(MemHandle h) {
    if (released_.count(h) == 0 || mappings_of(h) != 0) return;
    used_ -= handles_.at(h);
    handles_.erase(h);
    released_.erase(h);
    contents_.erase(h);
  }
  std::map<DevicePtr, MemHandle> mappings_;
  MemHandle next_handle_ = 1;
  std::map<int, std::set<DevicePtr>> peer_access_;
  std::set<DevicePtr> own_access_;  // granules this device may use
  int fail_next_access_ = 0;
};

}  // namespace cachalloc::testing
