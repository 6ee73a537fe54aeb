// test_obs_files.cpp — path templates, atomic writes (symlink refusal, no
// leftovers), unwritable paths (one warning, no crash), and
// write_exit_reports() end to end: stats file, stats:stderr, snapshot, trace.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "obs/atomic_file.h"
#include "obs/path_template.h"
#include "obs/reports.h"
#include "test_obs_json_parse.h"

using namespace cachalloc;
using namespace cachalloc::obs;
using obs_test::parse_json;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cachalloc-obs-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    DIR* d = opendir(path.c_str());
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    closedir(d);
    return out;
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs fn with fd 2 redirected to a file; returns what was written there.
template <typename Fn>
std::string capture_stderr(Fn fn) {
  char name[] = "/tmp/cachalloc-stderr-XXXXXX";
  int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  int saved = dup(2);
  dup2(fd, 2);
  fn();
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::string text = read_file(name);
  unlink(name);
  return text;
}

struct EnvVar {
  std::string name;
  explicit EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

void clear_rank_env() {
  for (const char* n : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) unsetenv(n);
}

// Every variable JobPlace reads, so that a test run inside a real job (CI
// under Slurm) sees only what the test sets.
void clear_job_env() {
  for (const char* n : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                        "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "FLUX_TASK_RANK",
                        "FLUX_JOB_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                        "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE",
                        "OMPI_MCA_ess_base_jobid", "FLUX_JOB_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID"})
    unsetenv(n);
}

ProcessReport small_report() {
  ProcessReport r;
  r.pid = 77;
  r.command_line = "./app";
  DeviceReport d;
  d.device = 0;
  d.stats.allocation.increase(false, 1);
  d.stats.allocated_bytes.increase(false, 2 * MiB);
  d.stats.reserved_bytes.increase(false, 2 * MiB);
  SegmentInfo seg{};
  seg.base = 0x1000;
  seg.size = 2 * MiB;
  seg.blocks.push_back(BlockInfo{0x1000, 2 * MiB, 2 * MiB - 5, BlockState::allocated, 0});
  d.segments.push_back(seg);
  r.devices.push_back(d);
  return r;
}

}  // namespace

TEST_CASE("path templates expand %p %h %r %d %%", "[obs][files]") {
  TemplateContext ctx{"123", "host-a", "5", "20260101-120000"};
  CHECK(expand_path_template("/tmp/stats-%p.json", ctx) == "/tmp/stats-123.json");
  CHECK(expand_path_template("%h_%r_%p_%d", ctx) == "host-a_5_123_20260101-120000");
  CHECK(expand_path_template("100%%.json", ctx) == "100%.json");
  CHECK(expand_path_template("%x%", ctx) == "%x%");  // unknown and trailing % kept
  CHECK(expand_path_template("", ctx).empty());
  CHECK(expand_path_template("plain", ctx) == "plain");
}

TEST_CASE("rank comes from the first set variable, else 0", "[obs][files]") {
  clear_rank_env();
  CHECK(rank_from_environment() == "0");
  {
    EnvVar slurm("SLURM_PROCID", "9");
    CHECK(rank_from_environment() == "9");
    EnvVar pmi("PMI_RANK", "8");
    CHECK(rank_from_environment() == "8");
    EnvVar ompi("OMPI_COMM_WORLD_RANK", "7");
    CHECK(rank_from_environment() == "7");
    EnvVar rank("RANK", "6");
    CHECK(rank_from_environment() == "6");
    EnvVar empty("RANK", "");  // empty counts as unset
    CHECK(rank_from_environment() == "7");
  }
  CHECK(rank_from_environment() == "0");
}

TEST_CASE("job place: no launcher, no rank", "[obs][files]") {
  clear_job_env();
  JobPlace p = job_place_from_environment();
  CHECK_FALSE(p.rank.has_value());
  CHECK_FALSE(p.world_size.has_value());
  CHECK(p.rank_variable.empty());
  CHECK(p.job.empty());
  CHECK(rank_from_environment() == "0");  // the file name still says 0
}

TEST_CASE("job place: the rank %r names, its own launcher's size, the launcher's job id first", "[obs][files]") {
  clear_job_env();
  EnvVar procid("SLURM_PROCID", "3"), ntasks("SLURM_NTASKS", "8"), jobid("SLURM_JOB_ID", "991");
  JobPlace p = job_place_from_environment();
  CHECK(p.rank == 3);
  CHECK(p.world_size == 8);
  CHECK(p.rank_variable == "SLURM_PROCID");
  CHECK(p.job == "SLURM_JOB_ID=991");
  {
    // torchrun inside srun: RANK wins, and the size is torchrun's, not srun's
    EnvVar rank("RANK", "5"), world("WORLD_SIZE", "16"), run_id("TORCHELASTIC_RUN_ID", "none");
    p = job_place_from_environment();
    CHECK(p.rank == 5);
    CHECK(p.world_size == 16);
    CHECK(p.rank_variable == "RANK");
    CHECK(p.job == "SLURM_JOB_ID=991");  // "none" (no --rdzv-id) tells no job apart
    EnvVar named("TORCHELASTIC_RUN_ID", "abc");
    CHECK(job_place_from_environment().job == "TORCHELASTIC_RUN_ID=abc");
  }
  {
    // a launcher that sets no size: none, not another launcher's
    EnvVar pmix("PMIX_RANK", "2");
    p = job_place_from_environment();
    CHECK(p.rank == 2);
    CHECK_FALSE(p.world_size.has_value());
    CHECK(p.rank_variable == "PMIX_RANK");
  }
  clear_job_env();
}

TEST_CASE("job place: a rank that is not a number is no rank, but still names the file", "[obs][files]") {
  clear_job_env();
  for (const char* text : {"x1", "1x", "-1", "99999999999999999999"}) {
    INFO(text);
    EnvVar rank("RANK", text), world("WORLD_SIZE", "");
    JobPlace p = job_place_from_environment();
    CHECK_FALSE(p.rank.has_value());
    CHECK_FALSE(p.world_size.has_value());
    CHECK(p.rank_variable == "RANK");
    CHECK(rank_from_environment() == text);
  }
  clear_job_env();
}

TEST_CASE("current template context: this pid, a host, a date", "[obs][files]") {
  TemplateContext ctx = current_template_context();
  CHECK(ctx.pid == std::to_string(getpid()));
  CHECK(!ctx.host.empty());
  CHECK(ctx.datetime.size() == 15);
  CHECK(ctx.datetime[8] == '-');
}

TEST_CASE("atomic write replaces the file and leaves no temporary", "[obs][files]") {
  TempDir dir;
  std::string path = dir.path + "/out.json";
  std::string err;
  REQUIRE(atomic_write_file(path, "first", &err));
  REQUIRE(atomic_write_file(path, "second", &err));
  CHECK(read_file(path) == "second");
  CHECK(dir.entries() == std::vector<std::string>{"out.json"});
}

TEST_CASE("atomic write refuses a symbolic link target", "[obs][files]") {
  TempDir dir;
  std::string victim = dir.path + "/victim";
  { std::ofstream(victim) << "precious"; }
  std::string link = dir.path + "/stats.json";
  REQUIRE(symlink(victim.c_str(), link.c_str()) == 0);
  std::string err;
  CHECK_FALSE(atomic_write_file(link, "evil", &err));
  CHECK(err.find("symbolic link") != std::string::npos);
  CHECK(read_file(victim) == "precious");
  struct stat st {};
  REQUIRE(lstat(link.c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));  // the link is untouched too
  CHECK(dir.entries().size() == 2);
}

TEST_CASE("a planted link, dangling or at a temporary name, is never written through", "[obs][files]") {
  TempDir dir;
  std::string err;
  // A dangling link: writing through it would create the file it names.
  std::string elsewhere = dir.path + "/elsewhere";
  std::string link = dir.path + "/trace.json";
  REQUIRE(symlink(elsewhere.c_str(), link.c_str()) == 0);
  CHECK_FALSE(atomic_write_file(link, "evil", &err));
  CHECK(err == "it is a symbolic link, and cachalloc never writes through a link (it may have been planted by "
               "someone else); the link and what it points to are left untouched");
  CHECK(access(elsewhere.c_str(), F_OK) != 0);
  // Links planted at the first temporary names this process would use: they
  // are skipped (O_EXCL|O_NOFOLLOW), the victim is untouched, the write works.
  std::string victim = dir.path + "/victim";
  { std::ofstream(victim) << "precious"; }
  std::string target = dir.path + "/stats.json";
  REQUIRE(atomic_write_file(target, "one", &err));  // learns nothing, but uses a counter value
  for (int n = 0; n < 10000; ++n) {
    std::string planted = dir.path + "/.stats.json.tmp." + std::to_string(getpid()) + "." + std::to_string(n);
    symlink(victim.c_str(), planted.c_str());  // some names exist already: fine
  }
  bool wrote = atomic_write_file(target, "two", &err);
  CHECK(read_file(victim) == "precious");
  if (wrote) {
    CHECK(read_file(target) == "two");
  } else {  // every name tried was taken: a clear reason, no write anywhere
    CHECK(err == "temporary files named .stats.json.tmp.* already exist in " + dir.path);
    CHECK(read_file(target) == "one");
  }
}

TEST_CASE("a temporary left by a killed process with the same pid does not block reports", "[obs][files]") {
  TempDir dir;
  std::string target = dir.path + "/stats.json";
  // The next counter values of this process, as a killed run with the same
  // pid (containers) would have left them.
  std::string err;
  REQUIRE(atomic_write_file(target, "probe", &err));
  // Every name of the next ones except one in 32 (the counter's value is
  // not known here): at most 31 are skipped before a free one.
  for (int n = 0; n < 10000; ++n) {
    if (n % 32 == 31) continue;
    std::string stale = dir.path + "/.stats.json.tmp." + std::to_string(getpid()) + "." + std::to_string(n);
    std::ofstream(stale) << "half";
  }
  CHECK(atomic_write_file(target, "whole", &err));
  CHECK(read_file(target) == "whole");
}

TEST_CASE("reasons name the directory and the cause", "[obs][files]") {
  TempDir dir;
  std::string err;
  std::string file = dir.path + "/a-file";
  { std::ofstream(file) << "x"; }
  CHECK_FALSE(atomic_write_file(file + "/stats.json", "data", &err));
  CHECK(err == "a component of " + file + " is not a directory");
  CHECK_FALSE(atomic_write_file(dir.path + "/missing/stats.json", "data", &err));
  CHECK(err == "directory " + dir.path + "/missing does not exist");
  // A directory that exists but takes no new files (procfs answers ENOENT):
  // the reason is not "does not exist" (issue 37).
  CHECK_FALSE(atomic_write_file("/proc/cachalloc-stats.json", "data", &err));
  CHECK(err.find("does not exist") == std::string::npos);
  CHECK(err.starts_with("directory /proc exists but does not allow creating files in it"));
  CHECK_FALSE(atomic_write_file(dir.path + "/" + std::string(300, 'n'), "data", &err));
  CHECK(err == "the path is too long");
  mkdir((dir.path + "/sub").c_str(), 0700);
  CHECK_FALSE(atomic_write_file(dir.path + "/sub", "data", &err));
  CHECK(err == "it is a directory");
  if (geteuid() != 0) {
    chmod(dir.path.c_str(), 0500);
    CHECK_FALSE(atomic_write_file(dir.path + "/x.json", "data", &err));
    CHECK(err == "no permission to create a file in directory " + dir.path);
    chmod(dir.path.c_str(), 0700);
  }
  if (access("/proc/self", F_OK) == 0) {  // not writable even for root
    CHECK_FALSE(atomic_write_file("/proc/cachalloc-stats.json", "data", &err));
    CHECK(!err.empty());
  }
}

TEST_CASE("a very long path is shown shortened in the warning", "[obs][files]") {
  ProcessReport r = small_report();
  r.config.stats = "/nonexistent-dir-cachalloc/" + std::string(100000, 'p');
  std::string err = capture_stderr([&] { write_exit_reports(r, TraceRing::Contents{}); });
  CHECK(err.size() < 1000);
  CHECK(err.find("... (100027 bytes): ") != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}

TEST_CASE("report signals wait while a report is written, and the mask is restored", "[obs][files]") {
  TempDir dir;
  ProcessReport r = small_report();
  r.config.stats = dir.path + "/stats.json";
  r.config.snapshot_signal = SIGUSR2;
  sigset_t before, after;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  write_exit_reports(r, TraceRing::Contents{});
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  for (int sig : {SIGTERM, SIGINT, SIGUSR2}) CHECK(sigismember(&before, sig) == sigismember(&after, sig));
  CHECK(!read_file(dir.path + "/stats.json").empty());
}

TEST_CASE("atomic write into a missing or read-only directory fails cleanly", "[obs][files]") {
  std::string err;
  CHECK_FALSE(atomic_write_file("/nonexistent-dir-cachalloc/x.json", "data", &err));
  CHECK(!err.empty());
  CHECK_FALSE(atomic_write_file("", "data", &err));
  TempDir dir;
  CHECK_FALSE(atomic_write_file(dir.path + "/", "data", &err));
  if (geteuid() != 0) {  // root writes anywhere
    chmod(dir.path.c_str(), 0500);
    CHECK_FALSE(atomic_write_file(dir.path + "/x.json", "data", &err));
    chmod(dir.path.c_str(), 0700);
  }
  // A directory at the target: rename fails, the temporary is removed.
  mkdir((dir.path + "/sub").c_str(), 0700);
  CHECK_FALSE(atomic_write_file(dir.path + "/sub", "data", &err));
  CHECK(dir.entries() == std::vector<std::string>{"sub"});
}

TEST_CASE("unwritable stats path: exactly one warning, other reports still written", "[obs][files]") {
  TempDir dir;
  ProcessReport r = small_report();
  r.config.stats = "/nonexistent-dir-cachalloc/stats-%p.json";
  r.config.snapshot = dir.path + "/snap.json";
  std::string err = capture_stderr([&] { write_exit_reports(r, TraceRing::Contents{}); });
  CHECK(err == "cachalloc: warning: cannot write the stats dump to /nonexistent-dir-cachalloc/stats-" +
                   std::to_string(getpid()) +
                   ".json: directory /nonexistent-dir-cachalloc does not exist. To get it, set stats in "
                   "CACHALLOC_CONF to a path in an existing, writable directory (cachalloc creates no directories "
                   "and never writes through a symbolic link); the program itself is not affected.\n");
  CHECK(parse_json(read_file(dir.path + "/snap.json"))["devices"][0]["segments"].items.size() == 1);
}

TEST_CASE("write_exit_reports writes stats, snapshot and trace files", "[obs][files]") {
  TempDir dir;
  ProcessReport r = small_report();
  r.config.stats = dir.path + "/stats-%p-%r.json";
  r.config.snapshot = dir.path + "/snap-%p.json";
  r.config.trace = dir.path + "/trace-%p.json";
  TraceRing ring(8);
  ring.push(TimedEvent{1000, 0, TraceEvent{TraceKind::segment_map, 0x1000, 2 * MiB, 0, 0, 2 * MiB}});
  ring.push(TimedEvent{3500, 0, TraceEvent{TraceKind::alloc, 0x1000, 2 * MiB, 0, 2 * MiB, 2 * MiB}});
  clear_rank_env();
  std::string err = capture_stderr([&] { write_exit_reports(r, ring.contents()); });
  CHECK(err.empty());
  std::string pid = std::to_string(getpid());
  auto stats = parse_json(read_file(dir.path + "/stats-" + pid + "-0.json"));
  CHECK(stats["devices"][0]["stats"]["allocated_bytes.all.current"].i64() == static_cast<std::int64_t>(2 * MiB));
  auto snap = parse_json(read_file(dir.path + "/snap-" + pid + ".json"));
  CHECK(snap["devices"][0]["segments"][0]["blocks"][0]["requested_size"].u64() == 2 * MiB - 5);
  auto trace = parse_json(read_file(dir.path + "/trace-" + pid + ".json"));
  CHECK(trace["traceEvents"].items.size() == 2 + 2 * 3);  // 2 metadata + (instant + 2 counters) per event
  CHECK(dir.entries().size() == 3);
}

TEST_CASE("stats:stderr prints the table, no file", "[obs][files]") {
  ProcessReport r = small_report();
  r.config.stats = "stderr";
  std::string err = capture_stderr([&] { write_exit_reports(r, TraceRing::Contents{}); });
  CHECK(err.find("cachalloc CUDA memory summary, device ID 0") != std::string::npos);
  CHECK(err.find("| Allocated memory      |   2048 KiB |") != std::string::npos);
  CHECK(err.find("cachalloc interposer summary") != std::string::npos);
}

TEST_CASE("nothing configured: nothing written", "[obs][files]") {
  ProcessReport r = small_report();
  // Run from an empty directory: a report written to a default (relative)
  // name would appear there.
  TempDir dir;
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof cwd) != nullptr);
  REQUIRE(chdir(dir.path.c_str()) == 0);
  std::string err = capture_stderr([&] {
    write_exit_reports(r, TraceRing::Contents{});
    write_snapshot(r);
  });
  REQUIRE(chdir(cwd) == 0);
  CHECK(err.empty());
  CHECK(dir.entries().empty());
}
