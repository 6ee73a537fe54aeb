// trace_json.h — the timeline in Chrome's trace-event JSON format, which
// Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
//   {"traceEvents":[
//      {"name":"process_name","ph":"M","pid":P,"args":{"name":"cachalloc <pid>"}},
//      {"name":"thread_name","ph":"M","pid":P,"tid":DEV,"args":{"name":"device DEV"}}, (per device)
//      {"name":"alloc","cat":"cachalloc","ph":"i","s":"p","ts":US,"pid":P,"tid":DEV,
//       "args":{"device":DEV,"ptr":"0x..","size":N,"stream":"0x.."}},
//      {"name":"allocated bytes (device DEV)","ph":"C","ts":US,"pid":P,"args":{"bytes":N}},
//      {"name":"reserved bytes (device DEV)","ph":"C","ts":US,"pid":P,"args":{"bytes":N}}, ...],
//    "displayTimeUnit":"ns",
//    "otherData":{"version":1,"dropped_events":N,"trace_max_entries":N,"recorded_events":N}}
// Instant-event names: alloc, free, segment_map, segment_unmap, oom,
// empty_cache.  ts is microseconds of the steady clock, relative to the
// first recorded event (three decimals, so ns resolution survives).  Each
// instant event is followed by the two counter samples it produced.
#pragma once

#include <string>

#include "trace_ring.h"

namespace cachalloc::obs {

const char* trace_kind_name(TraceKind k);

std::string trace_json(const TraceRing::Contents& trace, int pid);

}  // namespace cachalloc::obs
