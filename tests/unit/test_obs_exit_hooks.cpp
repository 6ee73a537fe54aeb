// test_obs_exit_hooks.cpp — shim/exit_hooks.cpp in forked children: reports
// are written exactly once at exit(), on SIGTERM with the default
// disposition (the child still dies of SIGTERM), not at all in fork
// children; a program's own handler is chained; an ignored signal stays
// ignored; the snapshot signal writes a snapshot and the program goes on.
// The report source the shim passes (report_source.cpp) is stubbed here:
// collect_stub, handed to cachalloc_install_exit_hooks.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "../../shim/exit_hooks.h"
#include "test_obs_json_parse.h"

using namespace cachalloc;

namespace {

Config g_config;
std::string g_calls_file;  // one line per collect_report call

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cachalloc-hooks-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

// Exit code of a child; see in_child.
int g_child_code = 0;

// exit() from a child: runs the atexit handlers (the hooks under test).
[[noreturn]] void child_exit(int code) {
  g_child_code = code;
  std::exit(code);
}

// Runs `body` in a child process; returns its wait status.  The child ends
// through child_exit() (atexit handlers run, the hooks' first) and then
// _exit()s before Catch2's own static destructors, which do not expect to
// run in a forked copy (its XML/JUnit reporter crashes there).
int in_child(const std::function<void()>& body) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Catch2 installs handlers for fatal signals; a plain program has none.
    for (int sig : {SIGTERM, SIGINT, SIGUSR2}) signal(sig, SIG_DFL);
    std::atexit([] { _exit(g_child_code); });  // registered before the hooks: runs after them
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

Config stats_config(const TempDir& dir) {
  Config c;
  c.stats = dir.path + "/stats-%p.json";
  return c;
}

int count_lines(const std::string& path) {
  std::string text = read_file(path);
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

cachalloc::obs::ProcessReport collect_stub(bool with_segments) {
  std::ofstream(g_calls_file, std::ios::app) << (with_segments ? "segments\n" : "plain\n");
  cachalloc::obs::ProcessReport r;
  r.config = g_config;
  r.pid = getpid();
  r.command_line = "test_obs_exit_hooks";
  cachalloc::obs::DeviceReport d;
  d.stats.allocation.increase(false, 1);
  if (with_segments) {
    SegmentInfo seg{};
    seg.base = 0x2000;
    seg.size = 4096;
    d.segments.push_back(seg);
  }
  r.devices.push_back(d);
  return r;
}

}  // namespace

TEST_CASE("exit() writes the dump once", "[obs][hooks]") {
  TempDir dir;
  g_config = stats_config(dir);
  g_calls_file = dir.path + "/calls";
  int status = in_child([&] {
    cachalloc_install_exit_hooks(g_config, collect_stub);
    cachalloc_install_exit_hooks(g_config, collect_stub);  // idempotent
    child_exit(3);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK(count_lines(g_calls_file) == 1);
  CHECK(read_file(g_calls_file) == "plain\n");
  // The file name carries the child's pid, which the dump also records.
  std::string listing;
  std::system(("ls " + dir.path + " > " + dir.path + "/ls.txt").c_str());
  listing = read_file(dir.path + "/ls.txt");
  auto pos = listing.find("stats-");
  REQUIRE(pos != std::string::npos);
  std::string name = listing.substr(pos, listing.find('\n', pos) - pos);
  auto j = obs_test::parse_json(read_file(dir.path + "/" + name));
  CHECK(name == "stats-" + std::to_string(j["pid"].i64()) + ".json");
  CHECK(j["devices"][0]["stats"]["allocation.all.allocated"].i64() == 1);
}

TEST_CASE("SIGTERM: reports written, the process still dies of SIGTERM", "[obs][hooks]") {
  TempDir dir;
  g_config = stats_config(dir);
  g_config.stats = dir.path + "/stats.json";
  g_calls_file = dir.path + "/calls";
  int status = in_child([&] {
    cachalloc_install_exit_hooks(g_config, collect_stub);
    raise(SIGTERM);
    _exit(99);  // not reached
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  CHECK(exists(dir.path + "/stats.json"));
  CHECK(count_lines(g_calls_file) == 1);
}

TEST_CASE("SIGINT with a program handler: chained, reports at the later exit", "[obs][hooks]") {
  TempDir dir;
  g_config = stats_config(dir);
  g_config.stats = dir.path + "/stats.json";
  g_calls_file = dir.path + "/calls";
  static volatile sig_atomic_t handled = 0;
  int status = in_child([&] {
    signal(SIGINT, [](int) { handled = handled + 1; });
    cachalloc_install_exit_hooks(g_config, collect_stub);
    raise(SIGINT);
    // The program's handler ran; nothing written yet; it decides to exit.
    child_exit(handled == 1 && !exists(dir.path + "/stats.json") ? 5 : 6);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 5);
  CHECK(exists(dir.path + "/stats.json"));
  CHECK(count_lines(g_calls_file) == 1);
}

TEST_CASE("an ignored SIGTERM stays ignored", "[obs][hooks]") {
  TempDir dir;
  g_config = stats_config(dir);
  g_config.stats = dir.path + "/stats.json";
  g_calls_file = dir.path + "/calls";
  int status = in_child([&] {
    signal(SIGTERM, SIG_IGN);
    cachalloc_install_exit_hooks(g_config, collect_stub);
    raise(SIGTERM);
    child_exit(exists(dir.path + "/stats.json") ? 6 : 0);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(count_lines(g_calls_file) == 1);  // from exit()
}

TEST_CASE("snapshot signal writes a snapshot and the program goes on", "[obs][hooks]") {
  TempDir dir;
  g_config = Config{};
  g_config.snapshot = dir.path + "/snap.json";
  g_config.snapshot_signal = SIGUSR2;
  g_calls_file = dir.path + "/calls";
  std::string snap = g_config.snapshot;
  int status = in_child([&] {
    cachalloc_install_exit_hooks(g_config, collect_stub);
    raise(SIGUSR2);
    if (!exists(snap)) _exit(7);
    unlink(snap.c_str());
    raise(SIGUSR2);  // every signal, not just the first
    child_exit(exists(snap) ? 0 : 8);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  auto j = obs_test::parse_json(read_file(snap));  // rewritten at exit too
  CHECK(j["devices"][0]["segments"][0]["address"].u64() == 0x2000);
  CHECK(read_file(g_calls_file) == "segments\nsegments\nsegments\n");
}

TEST_CASE("no report configured: no handlers, nothing written", "[obs][hooks]") {
  TempDir dir;
  g_config = Config{};
  g_calls_file = dir.path + "/calls";
  int status = in_child([&] {
    cachalloc_install_exit_hooks(g_config, collect_stub);
    struct sigaction sa {};
    sigaction(SIGTERM, nullptr, &sa);
    child_exit(sa.sa_handler == SIG_DFL ? 0 : 9);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(exists(g_calls_file));
}

TEST_CASE("a fork child does not write the parent's reports", "[obs][hooks]") {
  TempDir dir;
  g_config = stats_config(dir);
  g_calls_file = dir.path + "/calls";
  int status = in_child([&] {
    cachalloc_install_exit_hooks(g_config, collect_stub);
    pid_t grandchild = fork();
    if (grandchild == 0) child_exit(0);  // runs atexit handlers: must not write
    int st = 0;
    waitpid(grandchild, &st, 0);
    child_exit(exists(g_calls_file) ? 10 : 0);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(count_lines(g_calls_file) == 1);
}

TEST_CASE("write_exit_reports_once writes once", "[obs][hooks]") {
  TempDir dir;
  g_config = stats_config(dir);
  g_calls_file = dir.path + "/calls";
  int status = in_child([&] {
    cachalloc_install_exit_hooks(g_config, collect_stub);
    bool first = cachalloc_write_exit_reports_once();
    bool second = cachalloc_write_exit_reports_once();
    child_exit(first && !second ? 0 : 11);  // and exit() must not write again
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(count_lines(g_calls_file) == 1);
}
