// test_obs_json.cpp — the JSON writer and the stats/snapshot dump schemas:
// every flatten_stats() key present with the stats' own numbers.
#include <catch2/catch.hpp>

#include <string>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "obs/dump_json.h"
#include "obs/json_writer.h"
#include "obs/summary_table.h"
#include "test_obs_json_parse.h"

using namespace cachalloc;
using namespace cachalloc::obs;
using obs_test::Json;
using obs_test::parse_json;

namespace {

// A report built from a real allocator run on the fake backend.
struct RunReport {
  testing::FakeBackend backend{8 * GiB};
  CachingAllocator alloc{&backend, Config{}, 1};
  ProcessReport report;

  RunReport() {
    DevicePtr a = 0, b = 0, c = 0;
    REQUIRE(alloc.malloc(&a, 3 * MiB, 0) == kSuccess);
    REQUIRE(alloc.malloc(&b, 1000, 0) == kSuccess);
    REQUIRE(alloc.malloc(&c, 50 * MiB, 7) == kSuccess);
    REQUIRE(alloc.free(a) == kSuccess);
    report.pid = 4242;
    report.command_line = "python3 train.py --name \"quoted\"\tand\\slash";
    report.config.stats = "/tmp/x.json";
    report.calls[static_cast<int>(Entry::cuMemAlloc_v2)] = 3;
    report.calls[static_cast<int>(Entry::cudaMemGetInfo)] = 9;
    report.passthrough[static_cast<int>(Passthrough::capture)] = 2;
    report.ns_inside = 987654321;
    DeviceReport d;
    d.device = 1;
    d.stats = alloc.stats();
    d.device_total = 8 * GiB;
    d.segments = alloc.snapshot();
    report.devices.push_back(d);
  }
};

}  // namespace

TEST_CASE("JsonWriter escapes strings and places commas", "[obs][json]") {
  JsonWriter w;
  w.begin_object();
  w.field("s", std::string_view("a\"b\\c\nd\te\x01" "f\x1f"));
  w.key("arr");
  w.begin_array();
  w.value(1);
  w.value(std::uint64_t{18446744073709551615ULL});
  w.value(true);
  w.null();
  w.begin_object();
  w.end_object();
  w.end_array();
  w.field("neg", std::int64_t{-5});
  w.field("half", 0.5);
  w.field("nan", 0.0 / 0.0);
  w.end_object();
  CHECK(w.str() ==
        R"({"s":"a\"b\\c\nd\te\u0001f\u001f","arr":[1,18446744073709551615,true,null,{}],"neg":-5,"half":0.5,"nan":null})");
  Json j = parse_json(w.str());
  CHECK(j["s"].text == "a\"b\\c\nd\te\x01" "f\x1f");  // round trip
  CHECK(json_quote("é") == "\"é\"");                 // UTF-8 passes through
}

TEST_CASE("stats dump: schema and numbers equal the stats", "[obs][json]") {
  RunReport run;
  Json j = parse_json(stats_json(run.report, "node7"));
  CHECK(j["version"].i64() == 1);
  CHECK(j["pid"].i64() == 4242);
  CHECK(j["host"].text == "node7");
  CHECK(j["command_line"].text == run.report.command_line);
  CHECK(j["config"].text == run.report.config.to_string());

  const Json& calls = j["interposer"]["calls"];
  CHECK(calls.members.size() == static_cast<std::size_t>(Entry::count));
  for (int e = 0; e < static_cast<int>(Entry::count); ++e)
    CHECK(calls[entry_name(static_cast<Entry>(e))].u64() == run.report.calls[e]);
  CHECK(j["interposer"]["passthrough"]["capture"].u64() == 2);
  CHECK(j["interposer"]["passthrough"]["foreign_pointer"].u64() == 0);
  CHECK(j["interposer"]["ns_inside"].u64() == 987654321);

  REQUIRE(j["devices"].items.size() == 1);
  const Json& dev = j["devices"][0];
  CHECK(dev["device"].i64() == 1);
  CHECK(dev["device_total"].u64() == 8 * GiB);
  auto flat = flatten_stats(run.report.devices[0].stats);
  REQUIRE(flat.size() > 100);
  CHECK(dev["stats"].members.size() == flat.size());
  for (const auto& [key, value] : flat) {
    INFO(key);
    REQUIRE(dev["stats"].has(key));
    CHECK(dev["stats"][key].i64() == value);
  }
  // Spot checks against what the run did: 3 allocations, one freed.
  CHECK(dev["stats"]["allocation.all.allocated"].i64() == 3);
  CHECK(dev["stats"]["allocation.all.current"].i64() == 2);
  CHECK(dev["stats"]["requested_bytes.all.allocated"].i64() == static_cast<std::int64_t>(3 * MiB + 1000 + 50 * MiB));
  const DeviceStats& s = run.report.devices[0].stats;
  CHECK(dev["derived"]["device_allocations_avoided"].i64() == 3 - s.num_device_alloc);
  CHECK(dev["derived"]["peak_fragmentation"].f64() ==
        Approx(1.0 - double(s.active_bytes[StatType::aggregate].peak) / double(s.reserved_bytes[StatType::aggregate].peak)));
  // The table cachalloc-report summary prints: the library's own.
  CHECK(j["summary_table"].text == summary_text(run.report));
  CHECK(j["repeated_ooms"].kind == Json::array);
  CHECK(j["repeated_ooms"].items.empty());
}

TEST_CASE("stats dump: the rank, world size and job, null where the launcher set none", "[obs][json]") {
  RunReport run;
  Json none = parse_json(stats_json(run.report, "node7"));
  for (const char* key : {"rank", "world_size", "rank_variable", "job"}) {
    INFO(key);
    REQUIRE(none.has(key));
    CHECK(none[key].kind == Json::null);
  }
  run.report.job = JobPlace{3, 8, "SLURM_PROCID", "SLURM_JOB_ID=991"};
  Json j = parse_json(stats_json(run.report, "node7"));
  CHECK(j["rank"].i64() == 3);
  CHECK(j["world_size"].i64() == 8);
  CHECK(j["rank_variable"].text == "SLURM_PROCID");
  CHECK(j["job"].text == "SLURM_JOB_ID=991");
  run.report.job = JobPlace{0, std::nullopt, "LOCAL_RANK", ""};  // rank 0 is a rank, not "none"
  Json zero = parse_json(stats_json(run.report, "node7"));
  CHECK(zero["rank"].kind == Json::number);
  CHECK(zero["rank"].i64() == 0);
  CHECK(zero["world_size"].kind == Json::null);
  CHECK(zero["job"].kind == Json::null);
}

TEST_CASE("stats dump: a repeated out-of-memory condition, counted", "[obs][json]") {
  RunReport run;
  run.report.repeated_ooms.push_back({1, "per_process_memory_fraction", 288, 1073741, 1 * GiB, 64 * MiB});
  Json j = parse_json(stats_json(run.report, "node7"));
  REQUIRE(j["repeated_ooms"].items.size() == 1);
  const Json& r = j["repeated_ooms"][0];
  CHECK(r["device"].i64() == 1);
  CHECK(r["reason"].text == "per_process_memory_fraction");
  CHECK(r["count"].u64() == 288);
  CHECK(r["largest_need"].u64() == 64 * MiB);
  // 64 MiB of 1 GiB is 0.0625: "at least" the next two-digit value up.
  CHECK(r["summary"].text.find("refused 288 allocations") != std::string::npos);
  CHECK(r["summary"].text.find("at least 0.063") != std::string::npos);
}

TEST_CASE("stats dump: pinned host statistics only when the host cache was used", "[obs][json][host]") {
  RunReport run;
  CHECK_FALSE(parse_json(stats_json(run.report, "n")).has("pinned_host"));
  run.report.has_host = true;
  run.report.host.allocations.increase(3);
  run.report.host.allocations.decrease(1);
  run.report.host.reserved_bytes.increase(8192);
  run.report.host.num_host_alloc = 2;
  run.report.host.host_alloc_time_ns = 3'000'000;
  run.report.host.num_cache_hits = 1;
  Json j = parse_json(stats_json(run.report, "n"));
  const Json& h = j["pinned_host"];
  CHECK(h["allocated.current"].i64() == 2);
  CHECK(h["allocated.peak"].i64() == 3);
  CHECK(h["allocated.freed"].i64() == 1);
  CHECK(h["reserved_bytes.current"].i64() == 8192);
  CHECK(h["num_host_alloc"].i64() == 2);
  CHECK(h["host_alloc_time.total"].i64() == 3000);  // microseconds, as PyTorch
  CHECK(h["host_alloc_time.avg"].i64() == 1500);
  CHECK(h["num_cache_hits"].i64() == 1);
  CHECK(h.members.size() == flatten_host_stats(run.report.host).size());
  CHECK(summary_text(run.report).find("Pinned host: driver allocs / frees") != std::string::npos);
}

TEST_CASE("snapshot: every segment with its blocks", "[obs][json]") {
  RunReport run;
  Json j = parse_json(snapshot_json(run.report, "node7"));
  CHECK(j["version"].i64() == 1);
  const auto& segs = run.report.devices[0].segments;
  REQUIRE(!segs.empty());
  const Json& jsegs = j["devices"][0]["segments"];
  REQUIRE(jsegs.items.size() == segs.size());
  std::uint64_t total = 0;
  std::size_t allocated_blocks = 0;
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const Json& js = jsegs[i];
    CHECK(js["address"].u64() == segs[i].base);
    CHECK(js["total_size"].u64() == segs[i].size);
    CHECK(js["stream"].u64() == segs[i].stream);
    CHECK(js["segment_type"].text == (segs[i].small_pool ? "small" : "large"));
    CHECK(js["expandable"].b == segs[i].expandable);
    REQUIRE(js["blocks"].items.size() == segs[i].blocks.size());
    std::uint64_t sum = 0;
    for (std::size_t k = 0; k < segs[i].blocks.size(); ++k) {
      const Json& jb = js["blocks"][k];
      const BlockInfo& b = segs[i].blocks[k];
      CHECK(jb["address"].u64() == b.ptr);
      CHECK(jb["size"].u64() == b.size);
      CHECK(jb["requested_size"].u64() == b.requested);
      CHECK(jb["state"].text == block_state_name(b.state));
      sum += b.size;
      if (b.state == BlockState::allocated) ++allocated_blocks;
    }
    CHECK(sum == segs[i].size);  // blocks tile the segment
    total += segs[i].size;
  }
  CHECK(allocated_blocks == 2);  // b and c are live
  CHECK(total == static_cast<std::uint64_t>(run.report.devices[0].stats.reserved_bytes[StatType::aggregate].current));
}

TEST_CASE("block state names follow torch.cuda.memory_snapshot()", "[obs][json]") {
  CHECK(std::string(block_state_name(BlockState::allocated)) == "active_allocated");
  CHECK(std::string(block_state_name(BlockState::pending_free)) == "active_pending_free");
  CHECK(std::string(block_state_name(BlockState::inactive)) == "inactive");
  CHECK(std::string(block_state_name(BlockState::unmapped)) == "unmapped");
}

TEST_CASE("snapshot of expandable segments marks them and their unmapped ranges", "[obs][json]") {
  testing::FakeBackend backend(8 * GiB);
  Config cfg;
  cfg.expandable_segments = true;
  CachingAllocator alloc(&backend, cfg, 0);
  DevicePtr a = 0, b = 0;
  REQUIRE(alloc.malloc(&a, 30 * MiB, 0) == kSuccess);
  REQUIRE(alloc.malloc(&b, 30 * MiB, 0) == kSuccess);
  REQUIRE(alloc.free(b) == kSuccess);
  alloc.empty_cache();  // unmaps b's pages
  ProcessReport r;
  DeviceReport d;
  d.segments = alloc.snapshot();
  r.devices.push_back(d);
  Json j = parse_json(snapshot_json(r, "h"));
  bool saw_expandable = false, saw_unmapped = false;
  for (const Json& seg : j["devices"][0]["segments"].items) {
    if (!seg["expandable"].b) continue;
    saw_expandable = true;
    std::uint64_t allocated = 0, active = 0;
    for (const Json& blk : seg["blocks"].items) {
      if (blk["state"].text == "active_allocated") allocated += blk["size"].u64();
      if (blk["state"].text.rfind("active_", 0) == 0) active += blk["size"].u64();
      saw_unmapped = saw_unmapped || blk["state"].text == "unmapped";
    }
    CHECK(seg["allocated_size"].u64() == allocated);
    CHECK(seg["active_size"].u64() == active);  // unmapped ranges are not active
    CHECK(allocated >= 30 * MiB);
  }
  CHECK(saw_expandable);
  CHECK(saw_unmapped);
}
