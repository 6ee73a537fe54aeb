// process_state.cpp — first-use initialization, fork and exit handling.
#include "process_state.h"
#include "tags.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "load_mode.h"
#include "real_driver.h"
#include "shim_observability.h"

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

// Prints the parser's message once; write(2) avoids stdio buffering surprises.
// The message already names CACHALLOC_CONF, the key, the value and what is
// accepted; this adds what happens now and what to do.
void report_bad_config(const std::string& message) {
  std::string line = "cachalloc: " + message +
                     ". cachalloc is disabled for this process: every CUDA call goes to the driver unchanged. "
                     "Correct CACHALLOC_CONF (keys and values: README.md) or unset it.\n";
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void initialize() {
  g_time_wrappers.store(0, std::memory_order_relaxed);  // known from here on: off unless stats: says so
  const char* text = std::getenv("CACHALLOC_CONF");
  std::string message = parse_config(text ? text : "", &config_storage());
  if (!message.empty()) {
    config_storage() = Config();
    report_bad_config(message);
    g_mode.store(Mode::disabled, std::memory_order_release);
    return;
  }
  if (real_driver() == nullptr) {
    g_mode.store(Mode::disabled, std::memory_order_release);
    return;
  }
  g_time_wrappers.store(config_storage().stats.empty() ? 0 : 1, std::memory_order_relaxed);
  apply_config_tag(config_storage());
  pthread_atfork(nullptr, nullptr, on_fork_child);
  std::atexit(on_exit);
  start_observability(config_storage());
  // Preloaded: the hooks serve.  dlopen'ed (pluggable allocator): only the
  // pluggable ABI and the control API do (load_mode.h).
  const Mode m = interception_wanted() ? Mode::active : Mode::passive;
  g_mode.store(m, std::memory_order_release);
  if (m == Mode::active && g_time_wrappers.load(std::memory_order_relaxed) == 0)
    detail::g_fast_lane.store(true, std::memory_order_release);
}

}  // namespace

std::atomic<int> g_time_wrappers{-1};

bool detail::time_wrappers_after_init() {
  (void)current_mode();
  return g_time_wrappers.load(std::memory_order_relaxed) > 0;
}
namespace detail {
constinit thread_local bool t_in_timed_wrapper __attribute__((tls_model("initial-exec"))) = false;
}  // namespace detail

Mode detail::initialize_mode() {
  std::call_once(g_init_once, initialize);
  return g_mode.load(std::memory_order_acquire);
}

const Config& config() { return config_storage(); }


}  // namespace cachalloc::shim
