// dump_json.h — the stats:PATH dump and the snapshot, as JSON text.
//
// Stats dump schema (version 1; scripts/cachalloc-report and the GPU scripts
// read it):
//   {"version":1, "pid":N, "host":"...",
//    "rank":N|null, "world_size":N|null, "rank_variable":"RANK"|null,
//    "job":"SLURM_JOB_ID=123"|null,   (the launcher's variables: JobPlace,
//                                   path_template.h; null where none is set)
//    "command_line":"...", "config":"<Config::to_string()>",
//    "interposer":{"calls":{"<entry>":N,...}, "passthrough":{"<reason>":N,...},
//                  "ns_inside":N, "ns_in_driver":N, "driver_calls":N},
//    "pinned_host":{"<host_memory_stats() key>":N, ...},  (only when the process used
//                                   the pinned host cache; core/host_cache.h flatten_host_stats)
//    "devices":[{"device":0, "device_total":N,
//                "stats":{"<torch.cuda.memory_stats() key>":N, ...},
//                "derived":{"device_allocations_avoided":N,
//                           "peak_fragmentation":0.123}}]}
// Snapshot schema (version 1; names follow torch.cuda.memory_snapshot()):
//   {"version":1, "pid":N, "host":"...", "devices":[{"device":0, "segments":[
//     {"address":N, "total_size":N, "allocated_size":N, "active_size":N,
//      "requested_size":N, "stream":N, "segment_type":"small"|"large",
//      "expandable":bool,
//      "blocks":[{"address":N, "size":N, "requested_size":N,
//                 "state":"active_allocated"|"active_pending_free"|"inactive"
//                         |"unmapped" (expandable segments: address range without pages),
//                 "stream":N}, ...]}]}]}
#pragma once

#include <string>

#include "process_report.h"

namespace cachalloc::obs {

std::string stats_json(const ProcessReport& report, const std::string& host);
std::string snapshot_json(const ProcessReport& report, const std::string& host);

const char* block_state_name(BlockState s);

}  // namespace cachalloc::obs
