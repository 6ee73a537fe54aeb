// test_obs_trace.cpp — the trace ring (bounded, keeps the newest, counts
// drops), the ProcessObserver on a real allocator, and the Chrome
// trace-event JSON shape.
#include <catch2/catch.hpp>

#include <string>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "obs/process_observer.h"
#include "obs/trace_json.h"
#include "test_obs_json_parse.h"

using namespace cachalloc;
using namespace cachalloc::obs;
using obs_test::Json;
using obs_test::parse_json;

namespace {

TimedEvent event_at(std::uint64_t ns, DevicePtr ptr) {
  return TimedEvent{ns, 0, TraceEvent{TraceKind::alloc, ptr, 512, 0, 0, 0}};
}

Config tracing(std::size_t entries) {
  Config c;
  c.trace = "/tmp/unused.json";
  c.trace_max_entries = entries;
  return c;
}

}  // namespace

TEST_CASE("ring keeps the newest entries and counts the dropped ones", "[obs][trace]") {
  TraceRing ring(4);
  for (std::uint64_t i = 0; i < 3; ++i) ring.push(event_at(i, 0x100 + i));
  auto c = ring.contents();
  REQUIRE(c.events.size() == 3);
  CHECK(c.dropped == 0);
  CHECK(c.events.front().ns == 0);

  for (std::uint64_t i = 3; i < 11; ++i) ring.push(event_at(i, 0x100 + i));
  c = ring.contents();
  REQUIRE(c.events.size() == 4);
  CHECK(c.dropped == 7);
  CHECK(c.capacity == 4);
  for (std::size_t k = 0; k < 4; ++k) {  // 7, 8, 9, 10 in order
    CHECK(c.events[k].ns == 7 + k);
    CHECK(c.events[k].event.ptr == 0x107 + k);
  }
}

TEST_CASE("ring of capacity 0 records nothing", "[obs][trace]") {
  TraceRing ring(0);
  ring.push(event_at(1, 1));
  CHECK(ring.contents().events.empty());
  CHECK(ring.dropped() == 1);
}

TEST_CASE("observer records nothing while trace is off", "[obs][trace]") {
  ProcessObserver obs;
  obs.configure(Config{});
  CHECK_FALSE(obs.tracing());
  obs.on_event(0, TraceEvent{TraceKind::alloc, 1, 2, 0, 0, 0});
  CHECK(obs.trace_contents().events.empty());
}

TEST_CASE("observer on a real allocator: events in order, with running totals", "[obs][trace]") {
  ProcessObserver obs;
  obs.configure(tracing(100));
  testing::FakeBackend backend(8 * GiB);
  CachingAllocator alloc(&backend, Config{}, 2);
  alloc.set_observer(&obs);
  DevicePtr a = 0;
  REQUIRE(alloc.malloc(&a, 4 * MiB, 0) == kSuccess);
  REQUIRE(alloc.free(a) == kSuccess);
  alloc.empty_cache();

  auto c = obs.trace_contents();
  std::vector<TraceKind> kinds;
  for (const auto& e : c.events) {
    kinds.push_back(e.event.kind);
    CHECK(e.device == 2);
  }
  CHECK(kinds == std::vector<TraceKind>{TraceKind::segment_map, TraceKind::alloc, TraceKind::free,
                                        TraceKind::segment_unmap, TraceKind::empty_cache});
  for (std::size_t i = 1; i < c.events.size(); ++i) CHECK(c.events[i].ns >= c.events[i - 1].ns);
  const TraceEvent& alloc_ev = c.events[1].event;
  CHECK(alloc_ev.ptr == a);
  CHECK(alloc_ev.allocated_bytes == static_cast<std::int64_t>(4 * MiB));
  CHECK(c.events.back().event.reserved_bytes == 0);
}

TEST_CASE("observer bounds the trace at trace_max_entries", "[obs][trace]") {
  ProcessObserver obs;
  obs.configure(tracing(10));
  for (int i = 0; i < 25; ++i) obs.on_event(i % 2, TraceEvent{TraceKind::alloc, DevicePtr(i), 1, 0, i, i});
  auto c = obs.trace_contents();
  CHECK(c.events.size() == 10);
  CHECK(c.dropped == 15);
  CHECK(c.events.front().event.ptr == 15);
}

TEST_CASE("trace JSON: instant events and per-device counter tracks", "[obs][trace]") {
  TraceRing ring(2);
  ring.push(TimedEvent{5000, 0, TraceEvent{TraceKind::alloc, 0xdead, 10, 0, 1, 1}});  // dropped
  ring.push(TimedEvent{10'000, 0, TraceEvent{TraceKind::segment_map, 0x7f0000, 2 * MiB, 0x33, 0, 2 * MiB}});
  ring.push(TimedEvent{12'345'678, 1, TraceEvent{TraceKind::oom, 0, 3 * GiB, 0, 5 * MiB, 6 * MiB}});
  Json j = parse_json(trace_json(ring.contents(), 999));
  const Json& ev = j["traceEvents"];
  REQUIRE(ev.items.size() == 9);
  CHECK(ev[0]["ph"].text == "M");
  CHECK(ev[0]["args"]["name"].text == "cachalloc 999");
  for (int d = 0; d < 2; ++d) {  // one named row per device
    CHECK(ev[1 + d]["name"].text == "thread_name");
    CHECK(ev[1 + d]["tid"].i64() == d);
    CHECK(ev[1 + d]["args"]["name"].text == "device " + std::to_string(d));
  }

  const Json& map = ev[3];
  CHECK(map["name"].text == "segment_map");
  CHECK(map["ph"].text == "i");
  CHECK(map["ts"].text == "0.000");  // relative to the first kept event
  CHECK(map["pid"].i64() == 999);
  CHECK(map["tid"].i64() == 0);
  CHECK(map["args"]["ptr"].text == "0x7f0000");
  CHECK(map["args"]["size"].u64() == 2 * MiB);
  CHECK(map["args"]["stream"].text == "0x33");
  CHECK(ev[4]["ph"].text == "C");
  CHECK(ev[4]["name"].text == "allocated bytes (device 0)");
  CHECK(ev[4]["args"]["bytes"].i64() == 0);
  CHECK(ev[5]["name"].text == "reserved bytes (device 0)");
  CHECK(ev[5]["args"]["bytes"].i64() == static_cast<std::int64_t>(2 * MiB));

  CHECK(ev[6]["name"].text == "oom");
  CHECK(ev[6]["ts"].text == "12335.678");
  CHECK(ev[6]["args"]["size"].u64() == 3 * GiB);
  CHECK(ev[7]["name"].text == "allocated bytes (device 1)");
  CHECK(ev[8]["name"].text == "reserved bytes (device 1)");
  CHECK(ev[8]["args"]["bytes"].i64() == static_cast<std::int64_t>(6 * MiB));

  CHECK(j["otherData"]["dropped_events"].u64() == 1);
  CHECK(j["otherData"]["trace_max_entries"].u64() == 2);
  CHECK(j["otherData"]["recorded_events"].u64() == 2);
}

TEST_CASE("trace kind names", "[obs][trace]") {
  CHECK(std::string(trace_kind_name(TraceKind::segment_unmap)) == "segment_unmap");
  CHECK(std::string(trace_kind_name(TraceKind::empty_cache)) == "empty_cache");
  CHECK(std::string(trace_kind_name(TraceKind::free)) == "free");
}
