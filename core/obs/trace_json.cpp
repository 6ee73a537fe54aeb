// trace_json.cpp — see trace_json.h.
#include "trace_json.h"

#include <set>

#include "format.h"
#include "json_writer.h"

namespace cachalloc::obs {

namespace {

std::string hex(std::uint64_t v) { return obs::format("{:#x}", v); }

// Microseconds with three decimals (fixed point, so ns survive long runs).
std::string micros(std::uint64_t ns, std::uint64_t origin) {
  std::uint64_t d = ns - origin;
  return obs::format("{}.{:03d}", d / 1000, d % 1000);
}

void process_name(JsonWriter& w, int pid) {
  w.begin_object();
  w.field("name", "process_name");
  w.field("ph", "M");
  w.field("pid", pid);
  w.key("args");
  w.begin_object();
  w.field("name", obs::format("cachalloc {}", pid));
  w.end_object();
  w.end_object();
}

// Names the per-device rows ("tid" = device) in Perfetto / chrome://tracing.
void thread_names(JsonWriter& w, const TraceRing::Contents& t, int pid) {
  std::set<int> devices;
  for (const TimedEvent& e : t.events) devices.insert(e.device);
  for (int d : devices) {
    w.begin_object();
    w.field("name", "thread_name");
    w.field("ph", "M");
    w.field("pid", pid);
    w.field("tid", d);
    w.key("args");
    w.begin_object();
    w.field("name", obs::format("device {}", d));
    w.end_object();
    w.end_object();
  }
}

void instant(JsonWriter& w, const TimedEvent& e, const std::string& ts, int pid) {
  w.begin_object();
  w.field("name", trace_kind_name(e.event.kind));
  w.field("cat", "cachalloc");
  w.field("ph", "i");
  w.field("s", "p");
  w.key("ts");
  w.number_text(ts);
  w.field("pid", pid);
  w.field("tid", e.device);
  w.key("args");
  w.begin_object();
  w.field("device", e.device);
  w.field("ptr", hex(e.event.ptr));
  w.field("size", static_cast<std::uint64_t>(e.event.size));
  w.field("stream", hex(e.event.stream));
  w.end_object();
  w.end_object();
}

void counter(JsonWriter& w, const char* what, int device, std::int64_t bytes, const std::string& ts, int pid) {
  w.begin_object();
  w.field("name", obs::format("{} bytes (device {})", what, device));
  w.field("ph", "C");
  w.key("ts");
  w.number_text(ts);
  w.field("pid", pid);
  w.key("args");
  w.begin_object();
  w.field("bytes", bytes);
  w.end_object();
  w.end_object();
}

void other_data(JsonWriter& w, const TraceRing::Contents& t) {
  w.key("otherData");
  w.begin_object();
  w.field("version", 1);
  w.field("dropped_events", t.dropped);
  w.field("trace_max_entries", static_cast<std::uint64_t>(t.capacity));
  w.field("recorded_events", static_cast<std::uint64_t>(t.events.size()));
  w.end_object();
}

}  // namespace

const char* trace_kind_name(TraceKind k) {
  switch (k) {
    case TraceKind::alloc: return "alloc";
    case TraceKind::free: return "free";
    case TraceKind::segment_map: return "segment_map";
    case TraceKind::segment_unmap: return "segment_unmap";
    case TraceKind::oom: return "oom";
    case TraceKind::empty_cache: return "empty_cache";
  }
  return "?";
}

std::string trace_json(const TraceRing::Contents& t, int pid) {
  JsonWriter w;
  w.begin_object();
  w.key("traceEvents");
  w.begin_array();
  process_name(w, pid);
  thread_names(w, t, pid);
  std::uint64_t origin = t.events.empty() ? 0 : t.events.front().ns;
  for (const TimedEvent& e : t.events) {
    std::string ts = micros(e.ns, origin);
    instant(w, e, ts, pid);
    counter(w, "allocated", e.device, e.event.allocated_bytes, ts, pid);
    counter(w, "reserved", e.device, e.event.reserved_bytes, ts, pid);
  }
  w.end_array();
  w.field("displayTimeUnit", "ns");
  other_data(w, t);
  w.end_object();
  return w.take() + "\n";
}

}  // namespace cachalloc::obs
