// backend.cpp — DeviceBackend's defaults: a fence is one event on the legacy
// stream; cross-stream ordering and marks, and backups (host memory, copies) are not
// supported.
#include "backend.h"

namespace cachalloc {

Status DeviceBackend::fence_record(FenceId* out, FenceCost* cost) {
  EventId e = 0;
  Status st = event_create(&e);
  if (st != kSuccess) return st;
  st = event_record(e, 0);
  if (st != kSuccess) {
    event_destroy(e);
    return st;
  }
  *out = e;
  *cost = FenceCost{.events = 1};
  return kSuccess;
}

Status DeviceBackend::fence_query(FenceId fence) { return event_query(fence); }
Status DeviceBackend::fence_synchronize(FenceId fence) { return event_synchronize(fence); }
void DeviceBackend::fence_destroy(FenceId fence) { event_destroy(fence); }
Status DeviceBackend::fence_join(FenceId) { return kNotSupported; }
Status DeviceBackend::order_streams(StreamId, StreamId, EventId, StreamId*) { return kNotSupported; }
Status DeviceBackend::mark_stream(EventId, StreamId) { return kNotSupported; }
Status DeviceBackend::wait_event(StreamId, EventId) { return kNotSupported; }

Status DeviceBackend::host_alloc(std::size_t, void** out) {
  *out = nullptr;
  return kNotSupported;
}
void DeviceBackend::host_free(void*) {}
Status DeviceBackend::copy_to_host_async(void*, DevicePtr, std::size_t) { return kNotSupported; }
Status DeviceBackend::copy_to_device_async(DevicePtr, const void*, std::size_t) { return kNotSupported; }
Status DeviceBackend::copy_synchronize() { return kNotSupported; }

}  // namespace cachalloc
