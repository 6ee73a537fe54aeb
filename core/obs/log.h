// log.h — cachalloc's own logger (issue 4, item 5), over spdlog.
//
// One logger per process, never registered in spdlog's global registry (so a
// program that uses spdlog itself is not disturbed), leaked on purpose so it
// still works inside atexit handlers and after static destructors.
// The logger writes to stderr or to Config::log_file and never allocates
// device memory or calls CUDA.  Hot paths log only at debug or below and
// guard the call with should_log(), which is inline: one relaxed load and a
// compare when the level is disabled.
//
//   if (obs::logger().should_log(LogLevel::debug)) obs::logger().debug(...);
//
// spdlog itself is included by log.cpp alone.  Header-only spdlog compiles
// its whole implementation into every file that includes it (about 17 s per
// file at -O2 -g); this facade keeps that cost to one file.  Messages are
// formatted by obs::vformat (format.h) and handed to spdlog whole, so the
// output (pattern "[cachalloc PID level] message") is spdlog's.
#pragma once

#include <atomic>
#include <string_view>
#include <utility>

#include "config.h"
#include "format.h"

namespace cachalloc::obs {

// Configures the logger from config.log_level and config.log_file.  The first
// call wins; later calls do nothing (the shim calls it lazily when CUDA is
// first used).  If log_file cannot be opened, logs go to stderr and one
// warning says so.  Never throws.
void init_logging(const Config& config);

class Logger {
 public:
  constexpr Logger() = default;

  // Whether a message at `level` would be written.
  bool should_log(LogLevel level) const noexcept {
    return level != LogLevel::off && static_cast<int>(level) >= level_.load(std::memory_order_relaxed);
  }
  LogLevel level() const noexcept { return static_cast<LogLevel>(level_.load(std::memory_order_relaxed)); }

  // Formats (fmt syntax, checked at compile time) and writes one message if
  // the level is enabled.  Never throws: a message that cannot be formatted
  // or written is dropped.
  template <typename... T>
  void log(LogLevel level, fmt::format_string<T...> format, T&&... args) noexcept {
    if (should_log(level)) log_formatted(level, format, fmt::make_format_args(args...));
  }
  template <typename... T>
  void trace(fmt::format_string<T...> format, T&&... args) noexcept {
    log(LogLevel::trace, format, std::forward<T>(args)...);
  }
  template <typename... T>
  void debug(fmt::format_string<T...> format, T&&... args) noexcept {
    log(LogLevel::debug, format, std::forward<T>(args)...);
  }
  template <typename... T>
  void info(fmt::format_string<T...> format, T&&... args) noexcept {
    log(LogLevel::info, format, std::forward<T>(args)...);
  }
  template <typename... T>
  void warn(fmt::format_string<T...> format, T&&... args) noexcept {
    log(LogLevel::warn, format, std::forward<T>(args)...);
  }
  template <typename... T>
  void error(fmt::format_string<T...> format, T&&... args) noexcept {
    log(LogLevel::err, format, std::forward<T>(args)...);
  }

  // Writes `message` as it is (no formatting) if the level is enabled.
  void write(LogLevel level, std::string_view message) noexcept;
  // Flushes what was written (file sinks buffer below warn).
  void flush() noexcept;

  // init_logging's: the level that should_log compares with.
  void set_level(LogLevel level) noexcept { level_.store(static_cast<int>(level), std::memory_order_relaxed); }

 private:
  void log_formatted(LogLevel level, fmt::string_view format, fmt::format_args args) noexcept;

  // Before init_logging: warn, as spdlog's default logger would be set.
  std::atomic<int> level_{static_cast<int>(LogLevel::warn)};
};

// The logger; usable before init_logging() (then it writes to stderr at warn).
// A constant-initialized object: usable from any constructor or destructor.
extern Logger g_logger;
inline Logger& logger() noexcept { return g_logger; }

}  // namespace cachalloc::obs
