// reuse_oracle.h — which freed address ranges may not be handed out yet,
// judged from what the fake backend has shown complete, not from what the
// allocator believes.
//
// A freed block may still be in use by work enqueued before its free:
//  * on each stream it was recorded on (record_stream) or that its free
//    listed (free_fenced), other than its own: until an event recorded on
//    that stream after the free is done (or a fence after it, or a device
//    synchronization), except for a request on that stream itself;
//  * on its own stream, for a request on another stream: likewise, or until
//    the requesting stream was made to wait on the device for an event
//    recorded on the own stream after the free (cross-stream reuse:
//    FakeBackend::stream_ordered_after); a request on the same stream is
//    ordered after the work by the stream itself;
//  * anywhere, for a deferred free (free_deferred, a plain cuMemFree): until
//    a fence recorded after the free completes, or a device synchronization,
//    or a fence recorded after the free is joined (all work enqueued later is
//    ordered after it: FakeBackend::device_ordered_after).
// The fake backend's clock (fake_backend.h: now(), stream_done_after(),
// device_done_after()) answers these.  The oracle errs towards "safe" only
// where the device has shown completion that the allocator could have seen.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "fake_backend.h"

namespace cachalloc::testing {

class ReuseOracle {
 public:
  explicit ReuseOracle(const FakeBackend& backend) : backend_(backend) {}

  // Call just before the allocator frees [ptr, ptr + size), allocated on
  // `own`, recorded on `uses`, its free listing `fence` (free_fenced).
  void freeing(DevicePtr ptr, std::size_t size, StreamId own, std::span<const StreamId> uses,
               std::span<const StreamId> fence = {}) {
    Freed r{ptr, size, own, backend_.now(), false, {}};
    for (auto list : {uses, fence})
      for (StreamId s : list)
        if (s != own && std::find(r.wait_on.begin(), r.wait_on.end(), s) == r.wait_on.end()) r.wait_on.push_back(s);
    add(r);
  }
  // Call just before the allocator's free_deferred of [ptr, ptr + size).
  void freeing_deferred(DevicePtr ptr, std::size_t size, StreamId own) {
    add(Freed{ptr, size, own, backend_.now(), true, {}});
  }

  // "" when [ptr, ptr + size), just allocated on `stream`, overlaps no range
  // still unsafe for it; else what it overlaps.  Ranges safe on every
  // stream are forgotten on the way.
  std::string check(DevicePtr ptr, std::size_t size, StreamId stream) {
    const DevicePtr from = ptr > max_size_ ? ptr - max_size_ : 0;
    for (auto it = ranges_.lower_bound(from); it != ranges_.end() && it->first < ptr + size;) {
      const Freed& r = it->second;
      if (r.ptr + r.size > ptr) {
        if (!safe_for(r, stream)) return describe(r, ptr, size, stream);
        if (r.deferred || !r.wait_on.empty()) ++waited_reuses_;
      }
      if (safe_everywhere(r)) it = ranges_.erase(it);
      else ++it;
    }
    return {};
  }
  // Addresses handed out again, rightly, after a wait for other streams or
  // a fence: how much the checks had to judge.
  std::size_t waited_reuses() const { return waited_reuses_; }

 private:
  struct Freed {
    DevicePtr ptr;
    std::size_t size;
    StreamId own;
    std::uint64_t at;  // the clock just before the free
    bool deferred;
    std::vector<StreamId> wait_on;  // other streams that used it
  };

  void add(const Freed& r) {
    max_size_ = std::max(max_size_, r.size);
    ranges_.emplace(r.ptr, r);
  }
  bool done_on(StreamId s, const Freed& r) const {
    return backend_.stream_done_after(s, r.at) || backend_.device_done_after(r.at);
  }
  bool safe_for(const Freed& r, StreamId stream) const {
    if (r.deferred) return backend_.device_done_after(r.at) || backend_.device_ordered_after(r.at);
    if (stream != r.own && !done_on(r.own, r) && !backend_.stream_ordered_after(stream, r.own, r.at)) return false;
    // (A request on one of the streams that used the block is ordered after
    // that stream's uses by the stream itself: a block lent to another
    // stream (steal_path.cpp) returns to its own stream's bins after the
    // events of the others only.)
    return std::all_of(r.wait_on.begin(), r.wait_on.end(), [&](StreamId s) {
      return s == stream || done_on(s, r) || backend_.stream_ordered_after(stream, s, r.at);
    });
  }
  bool safe_everywhere(const Freed& r) const {
    return r.deferred ? safe_for(r, r.own) : done_on(r.own, r) && safe_for(r, r.own);
  }
  static std::string describe(const Freed& r, DevicePtr ptr, std::size_t size, StreamId stream) {
    std::ostringstream out;
    out << std::hex << "early reuse: [0x" << ptr << ", +0x" << size << ") on stream 0x" << stream
        << " overlaps [0x" << r.ptr << ", +0x" << r.size << ") freed on stream 0x" << r.own << std::dec
        << " at tick " << r.at << (r.deferred ? " (deferred: no fence after it completed)" : "") << ", waiting on";
    for (StreamId s : r.wait_on) out << " 0x" << std::hex << s;
    return out.str();
  }

  const FakeBackend& backend_;
  std::multimap<DevicePtr, Freed> ranges_;
  std::size_t max_size_ = 0;
  std::size_t waited_reuses_ = 0;
};

}  // namespace cachalloc::testing
