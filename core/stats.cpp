// stats.cpp — naming and resetting DeviceStats.
#include "stats.h"

namespace cachalloc {

const char* stat_type_name(StatType t) {
  switch (t) {
    case StatType::aggregate: return "all";
    case StatType::small_pool: return "small_pool";
    case StatType::large_pool: return "large_pool";
  }
  return "?";
}

namespace {

template <typename Fn>
void for_each_array(DeviceStats& s, Fn fn) {
  for (StatArray* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                         &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
    for (Stat& st : arr->a) fn(st);
  s.for_each_shared_stat(fn);
}

void add_stat(std::vector<std::pair<std::string, std::int64_t>>& out, const std::string& prefix, const Stat& s) {
  out.emplace_back(prefix + ".current", s.current);
  out.emplace_back(prefix + ".peak", s.peak);
  out.emplace_back(prefix + ".allocated", s.allocated);
  out.emplace_back(prefix + ".freed", s.freed);
}

}  // namespace

void DeviceStats::reset_peak() {
  for_each_array(*this, [](Stat& s) { s.reset_peak(); });
}

void DeviceStats::reset_accumulated() {
  for_each_array(*this, [](Stat& s) { s.reset_accumulated(); });
  reset_counters();
}

std::vector<std::pair<std::string, std::int64_t>> flatten_stats(const DeviceStats& s) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  const std::pair<const char*, const StatArray*> arrays[] = {
      {"allocation", &s.allocation},          {"segment", &s.segment},
      {"active", &s.active},                  {"inactive_split", &s.inactive_split},
      {"allocated_bytes", &s.allocated_bytes}, {"reserved_bytes", &s.reserved_bytes},
      {"active_bytes", &s.active_bytes},      {"inactive_split_bytes", &s.inactive_split_bytes},
      {"requested_bytes", &s.requested_bytes}};
  for (const auto& [name, arr] : arrays)
    for (int t = 0; t < kNumStatTypes; ++t)
      add_stat(out, std::string(name) + "." + stat_type_name(static_cast<StatType>(t)), arr->a[t]);
  out.emplace_back("num_alloc_retries", s.num_alloc_retries);
  out.emplace_back("num_ooms", s.num_ooms);
  add_stat(out, "oversize_allocations", s.oversize_allocations);
  add_stat(out, "oversize_segments", s.oversize_segments);
  out.emplace_back("num_sync_all_streams", s.num_sync_all_streams);
  out.emplace_back("num_device_alloc", s.num_device_alloc);
  out.emplace_back("num_device_free", s.num_device_free);
  out.emplace_back("max_split_size", s.max_split_size);
  out.emplace_back("num_deferred_frees", s.num_deferred_frees);
  out.emplace_back("num_fences", s.num_fences);
  out.emplace_back("num_fence_events", s.num_fence_events);
  out.emplace_back("num_fence_stream_queries", s.num_fence_stream_queries);
  out.emplace_back("num_fence_waits", s.num_fence_waits);
  out.emplace_back("num_fence_joins", s.num_fence_joins);
  out.emplace_back("num_peak_releases", s.num_peak_releases);
  out.emplace_back("peak_release_bytes", s.peak_release_bytes);
  out.emplace_back("num_peak_remaps", s.num_peak_remaps);
  out.emplace_back("peak_remap_bytes", s.peak_remap_bytes);
  out.emplace_back("num_thread_cache_locked_allocs", s.num_thread_cache_locked_allocs);
  out.emplace_back("num_thread_fence_polls_not_ready", s.num_thread_fence_polls_not_ready);
  out.emplace_back("num_cross_stream_reuses", s.num_cross_stream_reuses);
  out.emplace_back("num_idle_cross_stream_reuses", s.num_idle_cross_stream_reuses);
  out.emplace_back("num_marked_cross_stream_reuses", s.num_marked_cross_stream_reuses);
  add_stat(out, "deferred_free_bytes", s.deferred_free_bytes);
  add_stat(out, "capture_held_bytes", s.capture_held_bytes);
  return out;
}

}  // namespace cachalloc
