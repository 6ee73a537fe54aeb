// stream_order.cpp — leaving the single sequence (see the table in the header).
#include "stream_order.h"

#include <execinfo.h>

#include <cstdlib>

#include <mutex>
#include <shared_mutex>

#include "capture_tracking.h"
#include "log.h"
#include "stream_ids.h"

namespace cachalloc::shim {

// Called for each stream noted while the context is serial.  A non-blocking
// stream, or a second blocking one, ends it: frees are fenced from then on
// (multi_stream_), and the blocks freed while serial — reusable at once,
// and perhaps cached for reuse already — may still be in use by work the
// new stream does not wait for.  multi_stream_ is set before the event is
// recorded: a free that still saw it clear happened before that store, so
// its block's last use was enqueued before the event.
void StreamOrder::leave_serial(StreamId id, bool non_blocking) {
  std::lock_guard lock(serial_mutex_);
  if (!serial_.load(std::memory_order_relaxed)) return;
  if (!non_blocking && (sole_blocking_ == 0 || sole_blocking_ == id)) {
    sole_blocking_ = id;
    return;
  }
  multi_stream_.store(true);
  // Only free_sync:auto reused blocks at once while serial (stream means the
  // user chose stream order; fence and device never do).
  const char* how = "";
  if (policy_ == FreeSync::automatic) how = record_serial_end() ? "event" : "sync";
  serial_.store(false, std::memory_order_release);
  log_leaving_serial(id, non_blocking, how);
}

// The serial-end event on the legacy stream, which is ordered after all
// work enqueued so far on every blocking stream.  False when it could not
// be recorded: then the device is synchronized instead (the old, blocking
// way), or, during a capture, nothing can be done and a warning says so.
// During a capture in this context the capture-begin event stands in for
// it (header, (3)): every block reusable at once was freed before it.
// Called with serial_mutex_ held; the capture gate is taken here, after it
// (the begin hook takes the gate, then capture_mutex_ only).
bool StreamOrder::record_serial_end() {
  std::shared_lock gate(capture_gate());
  if (captures_in_context(ctx_) != 0) [[unlikely]] {
    std::lock_guard lock(capture_mutex_);
    if (capture_begin_ != 0) {
      serial_end_ = capture_begin_;
      capture_begin_ = 0;
      serial_end_pending_.store(true, std::memory_order_release);
      return true;
    }
    obs::logger().warn(
        "device {}: a second stream appeared during a graph capture begun while another capture was in flight; "
        "blocks freed before it may be reused while earlier work still runs (create streams before capturing, or "
        "set free_sync:fence)",
        device_);
    return false;
  }
  // A strict capture of another context: a record on the legacy stream
  // might break it (the fake driver says so; the driver's rule is not
  // documented per context).
  if (strict_capture_in_flight()) [[unlikely]] {
    obs::logger().warn("device {}: a second stream appeared during another context's strict graph capture; blocks "
                       "freed before it may be reused while earlier work still runs",
                       device_);
    return false;
  }
  EventId event = 0;
  if (backend_->event_create(&event) == kSuccess) {
    if (backend_->event_record(event, kLegacyStreamId) == kSuccess) {
      serial_end_ = event;
      serial_end_pending_.store(true, std::memory_order_release);
      return true;
    }
    backend_->event_destroy(event);
  }
  if (backend_->synchronize_device() != kSuccess)
    obs::logger().warn("device {}: could not order a new stream after earlier work (event and synchronization "
                       "failed)",
                       device_);
  return false;
}

// Makes `id` wait for the serial-end event, until that event completes.
// The stream is named from the calling thread, which is the one noting it
// (a per-thread stream is only ever noted by its own thread).  The query
// answers "not ready" during a strict capture (CudaBackend::event_query);
// a stream that is itself capturing does not wait (an event recorded
// outside its capture would join or break it): its work runs when the
// graph is launched, long after.
void StreamOrder::order_after_serial_work(StreamId id) {
  std::lock_guard lock(serial_mutex_);
  if (serial_end_ == 0) return;
  if (backend_->event_query(serial_end_) == kSuccess) {
    backend_->event_destroy(serial_end_);
    serial_end_ = 0;
    serial_end_pending_.store(false, std::memory_order_release);
    return;
  }
  CUstream s = nullptr;
  if (capture_in_flight() && to_cu_stream(id, &s) && stream_is_capturing_now(s, false)) return;
  if (backend_->stream_wait_event(id, serial_end_) == kSuccess) return;
  if (!capture_in_flight() && backend_->synchronize_device() == kSuccess) return;
  obs::logger().warn("device {}: stream {:#x} could not be ordered after the work before it", device_, id);
}

void StreamOrder::capture_beginning(bool strict_elsewhere) {
  std::lock_guard lock(capture_mutex_);
  if (capture_begin_ != 0 || strict_elsewhere || policy_ != FreeSync::automatic ||
      !serial_.load(std::memory_order_acquire))
    return;
  EventId event = 0;
  if (backend_->event_create(&event) != kSuccess) return;
  if (backend_->event_record(event, kLegacyStreamId) != kSuccess) {
    backend_->event_destroy(event);
    return;
  }
  capture_begin_ = event;
}

void StreamOrder::captures_ended() {
  std::lock_guard lock(capture_mutex_);
  if (capture_begin_ == 0) return;
  backend_->event_destroy(capture_begin_);
  capture_begin_ = 0;
}

// Once per context: from here on plain frees wait for fences, which costs
// memory; the debug log names the caller, since programs often do not know
// which library of theirs created a stream.
void StreamOrder::log_leaving_serial(StreamId id, bool non_blocking, const char* how) {
  auto& logger = obs::logger();
  if (!logger.should_log(LogLevel::info)) return;
  const char* kind = id == kUnseenStreams ? "streams of entry points no hook sees"
                     : non_blocking       ? "non-blocking"
                     : is_per_thread_id(id) ? "a thread's per-thread default stream"
                                            : "a second blocking stream";
  const char* after = *how == 'e'   ? " (it waits on the device for the work enqueued before it)"
                      : *how == 's' ? " (the device was synchronized once, for the frees before it)"
                                    : "";
  logger.info("device {}: stream {:#x} ({}) is not ordered with every earlier one: plain frees now wait for "
              "fences{}",
              device_, id, kind, after);
  if (!logger.should_log(LogLevel::debug)) return;
  void* frames[24];
  const int n = backtrace(frames, 24);
  logger.debug("the stream's first call came from:");
  // One frame a line, on the log's sink (log_file: when given), not on fd 2.
  char** names = backtrace_symbols(frames, n);
  for (int i = 0; i < n; ++i) {
    if (names != nullptr)
      logger.debug("  {}", names[i]);
    else
      logger.debug("  {}", static_cast<const void*>(frames[i]));
  }
  std::free(names);
}

}  // namespace cachalloc::shim
