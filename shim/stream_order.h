// stream_order.h — what cachalloc knows about the order of one context's
// work, and the rule plain frees follow because of it: in one place.
//
// A plain cuMemFree / cudaFree names no stream, yet kernels on any stream
// may still use the block.  Under free_sync:auto a freed block may be
// reused at once only while every piece of work the context runs is in one
// sequence; otherwise it waits behind a fence (free_policy.h).  The shim
// sees no kernel launches directly, so each arrangement below says what it
// observes, and where it cannot prove one order the rule is the safe one.
//
// | arrangement                                   | what the shim observes                                 | plain frees        |
// |-----------------------------------------------|--------------------------------------------------------|--------------------|
// | legacy stream only                            | nothing else noted                                     | reuse at once      |
// | legacy + one blocking stream (cuBLASLt's)     | the stream's creation (cuStreamCreate hook)            | reuse at once (1)  |
// | legacy + one thread's per-thread stream       | any call naming it (stream_watch.h: every entry point  | reuse at once (1)  |
// |                                               | with a stream, generated; thunks for newer ones)       |                    |
// | two blocking streams, in any mix of created   | the second one noted                                   | fence (2)          |
// | ones and threads' per-thread streams          |                                                        |                    |
// | any non-blocking stream                       | its creation, or first use in a hooked call            | fence (2)          |
// | a stream of another context                   | cuStreamGetCtx: noted in its own context only          | its context's rule |
// | a stream destroyed                            | the destroy hook, in the stream's own context          | blocks cached on it wait for its work |
// | a graph capture in flight                     | the begin/end hooks (counted before the real begin,    | held for the graph (3) |
// |                                               | per context: capture_tracking.h)                        |                    |
// | a stream first noted during a capture         | as above (per-thread streams included: stream_watch.h) | fence (2), ordered after the capture-begin event (3) |
// | a stream-ordered request its stream's cache   | the request's stream (cuMemAllocAsync and _ptsz)       | another stream's whole free segment, ordered (4) |
// | cannot serve                                  |                                                        |                    |
//
// (1) The legacy stream synchronizes with every blocking stream both ways,
//     so work on it and on one blocking stream runs in one sequence.  A
//     per-thread default stream is a blocking stream of its thread.
// (2) A fence is one event capturing all the context's work
//     (cuCtxRecordEvent), or where the driver lacks it one event on the
//     legacy stream (ordered after every blocking stream, per-thread ones
//     included) plus one on each busy non-blocking stream (cuda_backend.cpp).
// (3) Frees during a capture are held for the capture's graphs (issue 34
//     item 2: core/ledger_owners.cpp, graph_owners.h, capture_owned.h), so
//     every block reusable at once was freed before the earliest capture in
//     flight in this context began, and a stream noted later in the
//     capture need only be ordered after work enqueued before the begin.
//     At that begin (the hook runs before the real begin, under the capture gate),
//     while the context is serial and no other capture is in flight in it
//     and no strict capture anywhere, an event is recorded on the legacy
//     stream: it covers the last uses of all those blocks.  A stream noted
//     while a capture is in flight in the context (where recording on the
//     legacy stream or cuCtxRecordEvent is forbidden) leaves the sequence as
//     any other and waits for that event instead of a new one.
// (4) Cross-stream reuse (core/steal_path.cpp): before the cache grows, a
//     request on B may take a whole free segment of another stream A.  A's
//     free blocks are safe in A's order (every rule above that lets a block
//     into A's bins makes it so), and B is made to wait on the device for
//     an event recorded on A at the steal (cuda_backend.cpp order_streams:
//     cuEventRecord + cuStreamWaitEvent), so B's use comes
//     after everything A's own reuse would come after; or, with no wait,
//     when an event recorded on A after the block became free (a mark,
//     cuda_backend.cpp mark_stream) was seen complete: the device is past
//     every use of it.  Refused while any
//     capture is in flight (a record on a capturing stream joins it, a wait
//     on an event from outside breaks it); never from a destroyed stream
//     (no record on a dead handle) nor for or from the plain-allocation
//     pseudo-stream (its blocks go to any stream: none can wait).  Another
//     thread's per-thread stream is covered by a context-wide event, else
//     by one on the legacy stream, which orders after it (1).
//
// Leaving the single sequence: blocks freed before it were reusable at
// once and may already be cached for reuse.  The stream that ends the
// sequence, and every stream noted after it until then, is made to wait
// (cuStreamWaitEvent, on the device, never the host) for an event recorded
// on the legacy stream at that moment: nothing it runs can overlap work
// enqueued before.  No host synchronization, so work that waits on the
// host (a kernel spinning on a flag the program sets later) cannot hang it.
// During a graph capture in this context that event cannot be recorded:
// the capture-begin event (3) stands in for it; a warning says so only if
// there is none (a strict capture elsewhere was in flight at the begin).
//
// Why reuse at once is safe (the argument a reviewer checks): a plain free
// is reused at once only while the context is serial.  Work reaches a
// stream only through a driver entry point.  Every stream the program can
// use is either (a) created — cuStreamCreate* are hooked on every route —
// (b) the legacy stream, or (c) a thread's per-thread stream, which the
// program can only name through an entry point that takes a stream or is a
// _ptsz/_ptds variant.  Every such entry point the toolkit's headers
// declare is wrapped on every route (generated from cudaTypedefs.h, so the
// list cannot miss one of them), and every entry point they do not declare
// is wrapped by a thunk that assumes the per-thread stream was used; a
// name bound at link time that no hook sees is found in the program's
// relocations and fences every free (link_imports.h).  So
// the per-thread stream of a thread is noted before its first work is
// enqueued, and noting ends the single sequence before that work can meet
// a block reused at once (leave_serial, order_after_serial_work).  What
// the shim cannot type costs a fence (memory), never an early reuse.
//
// Streams of green contexts are noted at their creation (every context
// leaves the sequence; the primary's context-wide fence covers them).
// Not observed (docs/INTERPOSER.md): a plugin loaded late that reaches a
// link-time name no hook sees before any rare call lets its imports be
// read; unknown entry points on architectures other than x86-64 (a
// warning names each).
#pragma once

#include <atomic>
#include <mutex>

#include "config.h"
#include "cuda_backend.h"
#include "stream_set.h"
#include "types.h"

namespace cachalloc::shim {

class StreamOrder {
 public:
  StreamOrder(CudaBackend* backend, FreeSync policy, int device, CUcontext ctx)
      : backend_(backend), policy_(policy), device_(device), ctx_(ctx) {}

  // A stream created in, or first used with, this context (never the legacy
  // stream).  Called before the stream runs anything the shim knows of.
  void note_stream(StreamId id, bool non_blocking) {
    if (non_blocking) nonblocking_.add(id);
    if (serial_.load(std::memory_order_acquire)) [[unlikely]] leave_serial(id, non_blocking);
    if (serial_end_pending_.load(std::memory_order_acquire)) [[unlikely]] order_after_serial_work(id);
  }
  // Work may reach streams no hook sees (link_imports.h): plain frees wait
  // for fences from here on, as after a non-blocking stream's creation.
  // `fresh`: nothing ran in the context yet, so nothing needs ordering.
  void note_unseen_streams(bool fresh) {
    if (fresh) {
      multi_stream_.store(true);
      serial_.store(false, std::memory_order_release);
    } else if (serial_.load(std::memory_order_acquire)) {
      leave_serial(kUnseenStreams, true);
    }
  }
  // A stream this context's fences do not name (a green context's): plain
  // frees fence from here on, and the stream waits for the work before.
  void note_foreign_stream(StreamId id) {
    if (serial_.load(std::memory_order_acquire)) [[unlikely]] leave_serial(id, true);
    if (serial_end_pending_.load(std::memory_order_acquire)) [[unlikely]] order_after_serial_work(id);
  }
  // Before the real cuStreamDestroy (waits for a fence recording on it).
  void forget_stream(StreamId id) { nonblocking_.remove(id); }

  // A capture is about to begin in this context, and none other is in
  // flight here (capture_tracking.cpp, the capture gate held exclusively,
  // before the real begin).  `strict_elsewhere`: a global or thread-local
  // capture is in flight in the process, which a record on the legacy
  // stream could break.  Records the capture-begin event (3).
  void capture_beginning(bool strict_elsewhere);
  // The last capture in flight in this context ended.
  void captures_ended();

  // True once two streams were seen that the driver does not order with
  // each other (the table above).  Read on every free (seq_cst: see
  // leave_serial, which orders these reads with the serial-end event).
  bool multi_stream() const { return multi_stream_.load(); }
  const StreamSet& nonblocking() const { return nonblocking_; }

  // The id leave_serial is told for streams no hook sees (never a stream's).
  static constexpr StreamId kUnseenStreams = 0;

 private:
  void leave_serial(StreamId id, bool non_blocking);
  bool record_serial_end();
  void order_after_serial_work(StreamId id);
  void log_leaving_serial(StreamId id, bool non_blocking, const char* how);

  CudaBackend* backend_;
  FreeSync policy_;
  int device_;
  CUcontext ctx_;
  StreamSet nonblocking_;  // live non-blocking streams
  std::atomic<bool> multi_stream_{false};
  // Guards the rest.  leave_serial holds it while it records the
  // serial-end event, so a stream noted meanwhile waits for that event too.
  std::mutex serial_mutex_;
  // Until multi_stream_: the one blocking stream besides the legacy stream
  // (0: none yet).
  StreamId sole_blocking_ = 0;
  std::atomic<bool> serial_{true};  // !multi_stream_, cleared once the event is recorded
  // The event on the legacy stream recorded when the sequence ended, until
  // it completes: streams noted meanwhile wait for it.
  EventId serial_end_ = 0;
  std::atomic<bool> serial_end_pending_{false};
  // (3): the event recorded on the legacy stream when the first capture in
  // flight in this context began, while serial; 0 when none.  Consumed as
  // serial_end_ by a stream noted during the capture, destroyed once no
  // capture is in flight here.  Under capture_mutex_, a leaf lock (taken
  // under the capture gate, and under serial_mutex_ then the gate).
  std::mutex capture_mutex_;
  EventId capture_begin_ = 0;
};

}  // namespace cachalloc::shim
