// process_state.cpp — first-use initialization, fork and exit handling.
#include "process_state.h"
#include "tags.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "load_mode.h"
#include "obs/log.h"
#include "real_driver.h"

namespace cachalloc::shim {

std::atomic<Mode> detail::g_mode{Mode::uninitialized};
std::atomic<bool> detail::g_fast_lane{false};
constinit obs::InterposerCounters detail::g_counters{};

namespace {

using detail::g_mode;
std::once_flag g_init_once;

// Leaked on purpose: read by hooks during exit, after static destructors.
Config& config_storage() {
  static Config* c = new Config();
  return *c;
}

void on_fork_child() {
  detail::g_fast_lane.store(false, std::memory_order_relaxed);
  g_mode.store(Mode::forked, std::memory_order_relaxed);
}

void on_exit() {
  // Later frees are no-ops; no driver call once exit has begun (the driver
  // may already be tearing down, and cudart's own atexit may follow).
  detail::g_fast_lane.store(false, std::memory_order_relaxed);
  const Mode m = g_mode.load(std::memory_order_relaxed);
  if (m == Mode::active || m == Mode::passive) g_mode.store(Mode::exiting, std::memory_order_relaxed);
}

// The messages of the items CACHALLOC_CONF could not apply (issue 37):
// leaked on purpose, read by the exit reports.
std::vector<std::string>& config_errors_storage() {
  static auto* v = new std::vector<std::string>();
  return *v;
}

void write_stderr(const std::string& line) {
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

bool strict_from_env() {
  const char* s = std::getenv("CACHALLOC_STRICT");
  return s != nullptr && s[0] != '\0' && std::strcmp(s, "0") != 0;
}

// strict: the bad items, one line each on stderr, and exit status 1.
[[noreturn]] void exit_strict(const std::vector<std::string>& errors) {
  for (const std::string& e : errors) write_stderr("cachalloc: " + e + "\n");
  write_stderr("cachalloc: strict: exiting with status 1 for " + std::to_string(errors.size()) +
               " bad CACHALLOC_CONF item(s) (correct them, or drop strict to run with the good keys only)\n");
  _exit(1);
}

// `cachalloc --check-conf`: every item not applied, one line each, then the
// effective configuration; status 1 if any is an error.
[[noreturn]] void check_conf_and_exit(const char* text) {
  Config c;
  const std::vector<std::string> messages = apply_config(text ? text : "", &c);
  for (const std::string& m : messages) write_stderr("cachalloc: " + m + "\n");
  const bool bad = has_config_errors(messages);
  write_stderr(std::string("cachalloc: ") + (bad ? "configuration has errors" : "configuration OK") +
               "; in effect: " + c.to_string() + "\n");
  _exit(bad ? 1 : 0);
}

// At load (preloaded or dlopen'ed): strict configurations are checked before
// the program runs.  The configuration itself is still read at the first
// CUDA call (programs may set CACHALLOC_CONF before it); nothing else
// happens here, and nothing at all without strict.
__attribute__((constructor)) void check_strict_at_load() {
  const char* text = std::getenv("CACHALLOC_CONF");
  if (std::getenv("CACHALLOC_CHECK_CONF") != nullptr) check_conf_and_exit(text);
  // No parse at all unless strict may be asked for (the first CUDA call
  // checks again, so a spelling this misses still exits there).
  if (!strict_from_env() && (text == nullptr || std::strstr(text, "strict") == nullptr)) return;
  Config c;
  const std::vector<std::string> errors = apply_config(text ? text : "", &c);
  if ((c.strict || strict_from_env()) && has_config_errors(errors)) exit_strict(errors);
}

// Each bad item once, on the log sink (stderr unless log_file:), at warn
// level but written whatever the level: a configuration cachalloc did not
// apply must never pass unseen.  The good keys applied; the exit reports
// list the bad ones again as config_errors.
void report_config_errors(const std::vector<std::string>& errors) {
  const bool logged = obs::logger().should_log(LogLevel::warn);
  for (const std::string& e : errors) {
    const std::string line = e + " (this item is not applied; the others are)";
    if (logged)
      obs::logger().write(LogLevel::warn, line);
    else
      write_stderr("cachalloc: " + line + "\n");
  }
  obs::logger().flush();
}

void initialize(const StartUpSteps& steps) {
  g_time_wrappers.store(0, std::memory_order_relaxed);  // known from here on: off unless stats: says so
  const char* text = std::getenv("CACHALLOC_CONF");
  config_errors_storage() = apply_config(text ? text : "", &config_storage());
  if (strict_from_env()) config_storage().strict = true;
  if (config_storage().strict && has_config_errors(config_errors_storage())) exit_strict(config_errors_storage());
  if (real_driver() == nullptr) {
    g_mode.store(Mode::disabled, std::memory_order_release);
    return;
  }
  g_time_wrappers.store(config_storage().stats.empty() ? 0 : 1, std::memory_order_relaxed);
  const std::vector<std::string> tms_warnings = apply_tms_env(config_storage());
  apply_config_tag(config_storage());
  pthread_atfork(nullptr, nullptr, on_fork_child);
  std::atexit(on_exit);
  steps.start_observability(config_storage());
  report_config_errors(config_errors_storage());
  for (const std::string& w : tms_warnings) obs::logger().warn("{} (docs/PAUSE.md)", w);
  // Preloaded: the hooks serve.  dlopen'ed (pluggable allocator): only the
  // pluggable ABI and the control API do (load_mode.h).
  const Mode m = interception_wanted() ? Mode::active : Mode::passive;
  // log_level:info and below: one line that says cachalloc runs, which
  // version, by which route and with what (issue 37: nothing else says so
  // unless statistics are on).
  if (obs::logger().should_log(LogLevel::info)) {
    const std::size_t bad = config_errors_storage().size();
    obs::logger().info("cachalloc {} active: route {}; configuration: {}{}", CACHALLOC_VERSION_STRING,
                       m == Mode::active ? "preload (LD_PRELOAD: the hooks serve the program's CUDA allocations)"
                                         : "pluggable (dlopen'ed: the pluggable allocator ABI and the control API serve)",
                       config_storage().to_string(),
                       bad == 0 ? std::string() : " (" + std::to_string(bad) + " CACHALLOC_CONF item(s) not applied)");
  }
  // Before the first context's cache: a program that binds at link time a
  // driver name no hook sees starts fenced (link_imports.h).
  if (m == Mode::active) steps.check_link_imports();
  g_mode.store(m, std::memory_order_release);
  if (m == Mode::active && g_time_wrappers.load(std::memory_order_relaxed) == 0)
    detail::g_fast_lane.store(true, std::memory_order_release);
}

}  // namespace

std::atomic<int> g_time_wrappers{-1};

namespace detail {
constinit thread_local bool t_in_timed_wrapper __attribute__((tls_model("initial-exec"))) = false;
}  // namespace detail

Mode detail::initialize_mode(const StartUpSteps& steps) {
  std::call_once(g_init_once, [&] { initialize(steps); });
  return g_mode.load(std::memory_order_acquire);
}

const Config& config() { return config_storage(); }
const std::vector<std::string>& config_errors() { return config_errors_storage(); }


}  // namespace cachalloc::shim
