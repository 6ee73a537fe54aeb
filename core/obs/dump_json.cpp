// dump_json.cpp — see dump_json.h.
#include "dump_json.h"

#include "json_writer.h"
#include "process_observer.h"
#include "summary_table.h"

namespace cachalloc::obs {

namespace {

void header_fields(JsonWriter& w, const ProcessReport& r, const std::string& host) {
  w.field("version", 1);
  w.field("pid", r.pid);
  w.field("host", host);
}

// An optional number, or null: a reader tells "not known" from 0.
void optional_field(JsonWriter& w, std::string_view name, const std::optional<std::int64_t>& v) {
  w.key(name);
  if (v) w.value(*v);
  else w.null();
}

void optional_field(JsonWriter& w, std::string_view name, const std::string& v) {
  w.key(name);
  if (!v.empty()) w.value(v);
  else w.null();
}

// Where the process stands in its job (path_template.h, JobPlace), so that
// `cachalloc-report job DIR` can merge the dumps of every rank.
void job_fields(JsonWriter& w, const JobPlace& job) {
  optional_field(w, "rank", job.rank);
  optional_field(w, "world_size", job.world_size);
  optional_field(w, "rank_variable", job.rank_variable);
  optional_field(w, "job", job.job);
}

void interposer_object(JsonWriter& w, const ProcessReport& r) {
  w.key("interposer");
  w.begin_object();
  w.key("calls");
  w.begin_object();
  for (int e = 0; e < static_cast<int>(Entry::count); ++e) w.field(entry_name(static_cast<Entry>(e)), r.calls[e]);
  w.end_object();
  w.key("passthrough");
  w.begin_object();
  for (int p = 0; p < static_cast<int>(Passthrough::count); ++p)
    w.field(passthrough_name(static_cast<Passthrough>(p)), r.passthrough[p]);
  w.end_object();
  w.field("ns_inside", r.ns_inside);
  w.field("ns_in_driver", r.ns_in_driver);
  w.field("driver_calls", r.driver_calls);
  w.key("driver_calls_by");  // only the functions called
  w.begin_object();
  for (int i = 0; i < static_cast<int>(DriverCall::count); ++i)
    if (r.driver_calls_by[i] != 0) w.field(driver_call_name(static_cast<DriverCall>(i)), r.driver_calls_by[i]);
  w.end_object();
  w.end_object();
}

// Out-of-memory conditions printed once and then counted (ProcessObserver).
void repeated_ooms_array(JsonWriter& w, const ProcessReport& r) {
  w.key("repeated_ooms");
  w.begin_array();
  for (const RepeatedOom& rep : r.repeated_ooms) {
    w.begin_object();
    w.field("device", rep.device);
    w.field("reason", std::string(rep.reason));
    w.field("count", rep.count);
    w.field("allowed", static_cast<std::uint64_t>(rep.allowed));
    w.field("largest_need", static_cast<std::uint64_t>(rep.largest_need));
    w.field("summary", repeated_oom_summary(rep));
    w.end_object();
  }
  w.end_array();
}

// "none", "host", "pageable" or "disk": where a tag's backups go, or where one lives.
const char* backup_mode_name(BackupMode m) {
  switch (m) {
    case BackupMode::host: return "host";
    case BackupMode::pageable: return "pageable";
    case BackupMode::disk: return "disk";
    default: return "none";
  }
}

// Per tag: bytes, pause/resume counts and times (docs/PAUSE.md).
void tags_object(JsonWriter& w, const DeviceReport& d) {
  w.key("tags");
  w.begin_object();
  for (const TagReport& t : d.tags) {
    const TagStats& s = t.stats;
    w.key(t.name);
    w.begin_object();
    w.field("paused", s.paused);
    w.field("cpu_backup", s.backup);
    w.field("segments", static_cast<std::uint64_t>(s.segments));
    w.field("reserved_bytes", static_cast<std::uint64_t>(s.reserved_bytes));
    w.field("allocated_bytes", static_cast<std::uint64_t>(s.allocated_bytes));
    w.field("paused_bytes", static_cast<std::uint64_t>(s.paused_bytes));
    w.field("backup_mode", backup_mode_name(s.backup_mode));
    w.field("backup_location", backup_mode_name(s.backup_location));
    w.field("backup_bytes", static_cast<std::uint64_t>(s.backup_bytes));
    w.field("backup_capacity_bytes", static_cast<std::uint64_t>(s.backup_capacity));
    w.field("retain_backup", s.retain);
    w.field("backup_retained_bytes", static_cast<std::uint64_t>(s.retained_bytes));
    w.field("backup_disk_bytes", static_cast<std::uint64_t>(s.disk_bytes));
    w.field("backup_disk_files", static_cast<std::uint64_t>(s.disk_files));
    w.field("backup_staging_bytes", static_cast<std::uint64_t>(s.staging_bytes));
    w.field("num_pauses", s.pauses);
    w.field("num_resumes", s.resumes);
    w.field("pause_seconds", s.pause_seconds);
    w.field("resume_seconds", s.resume_seconds);
    w.field("last_pause_seconds", s.last_pause_seconds);
    w.field("last_resume_seconds", s.last_resume_seconds);
    w.end_object();
  }
  w.end_object();
}

void device_object(JsonWriter& w, const DeviceReport& d) {
  w.begin_object();
  w.field("device", d.device);
  w.field("device_total", static_cast<std::uint64_t>(d.device_total));
  w.field("context_destroyed", d.context_destroyed);
  w.key("stats");
  w.begin_object();
  for (const auto& [name, value] : flatten_stats(d.stats)) w.field(name, value);
  w.end_object();
  w.key("derived");
  w.begin_object();
  w.field("device_allocations_avoided", device_allocations_avoided(d.stats));
  w.field("peak_fragmentation", peak_fragmentation(d.stats));
  w.end_object();
  if (!d.tags.empty()) tags_object(w, d);
  w.end_object();
}

void block_object(JsonWriter& w, const BlockInfo& b) {
  w.begin_object();
  w.field("address", static_cast<std::uint64_t>(b.ptr));
  w.field("size", static_cast<std::uint64_t>(b.size));
  w.field("requested_size", static_cast<std::uint64_t>(b.requested));
  w.field("state", block_state_name(b.state));
  w.field("stream", static_cast<std::uint64_t>(b.stream));
  w.end_object();
}

void segment_object(JsonWriter& w, const SegmentInfo& s, const DeviceReport& d) {
  std::uint64_t allocated = 0, active = 0, requested = 0;
  for (const BlockInfo& b : s.blocks) {
    if (b.state == BlockState::allocated) allocated += b.size;
    if (b.state == BlockState::allocated || b.state == BlockState::pending_free) active += b.size;
    requested += b.requested;
  }
  w.begin_object();
  w.field("address", static_cast<std::uint64_t>(s.base));
  w.field("total_size", static_cast<std::uint64_t>(s.size));
  w.field("allocated_size", allocated);
  w.field("active_size", active);
  w.field("requested_size", requested);
  w.field("stream", static_cast<std::uint64_t>(s.stream));
  w.field("segment_type", s.small_pool ? "small" : "large");
  w.field("expandable", s.expandable);
  if (s.tag != kUntagged) {
    std::string name = std::to_string(s.tag);
    for (const TagReport& t : d.tags)
      if (t.stats.tag == s.tag) name = t.name;
    w.field("tag", name);
    w.field("paused_size", static_cast<std::uint64_t>(s.paused_bytes));
  }
  w.key("blocks");
  w.begin_array();
  for (const BlockInfo& b : s.blocks) block_object(w, b);
  w.end_array();
  w.end_object();
}

}  // namespace

const char* block_state_name(BlockState s) {
  switch (s) {
    case BlockState::allocated: return "active_allocated";
    case BlockState::pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
    case BlockState::unmapped: return "unmapped";
  }
  return "?";
}

// Present only when the process used pinned host memory through the cache.
void host_object(JsonWriter& w, const ProcessReport& r) {
  if (!r.has_host) return;
  w.key("pinned_host");
  w.begin_object();
  for (const auto& [name, value] : flatten_host_stats(r.host)) w.field(name, value);
  w.end_object();
}

std::string stats_json(const ProcessReport& r, const std::string& host) {
  JsonWriter w;
  w.begin_object();
  header_fields(w, r, host);
  job_fields(w, r.job);
  w.field("command_line", r.command_line);
  w.field("config", r.config.to_string());
  w.key("config_errors");
  w.begin_array();
  for (const std::string& e : r.config_errors) w.value(e);
  w.end_array();
  interposer_object(w, r);
  repeated_ooms_array(w, r);
  host_object(w, r);
  w.key("devices");
  w.begin_array();
  for (const DeviceReport& d : r.devices) device_object(w, d);
  w.end_array();
  // The stats:stderr table, as text: `cachalloc-report summary` prints it,
  // so the table has one implementation (summary_table.cpp).
  w.field("summary_table", summary_text(r));
  w.end_object();
  return w.take() + "\n";
}

std::string snapshot_json(const ProcessReport& r, const std::string& host) {
  JsonWriter w;
  w.begin_object();
  header_fields(w, r, host);
  w.key("devices");
  w.begin_array();
  for (const DeviceReport& d : r.devices) {
    w.begin_object();
    w.field("device", d.device);
    w.key("segments");
    w.begin_array();
    for (const SegmentInfo& s : d.segments) segment_object(w, s, d);
    w.end_array();
    w.end_object();
  }
  w.end_array();
  w.end_object();
  return w.take() + "\n";
}

}  // namespace cachalloc::obs
