// log.cpp — see log.h.
#include "log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <atomic>
#include <mutex>

#include "atomic_file.h"
#include "path_template.h"

namespace cachalloc::obs {

namespace {

constexpr const char* kPattern = "[cachalloc %P %l] %v";

spdlog::logger* make_stderr_logger() {
  auto* log = new spdlog::logger("cachalloc", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log->set_pattern(kPattern);
  log->set_level(spdlog::level::trace);  // Logger::should_log filters
  return log;
}

// Leaked on purpose: logging must work in atexit handlers and after static
// destructors.  Replaced at most once, by init_logging().
std::atomic<spdlog::logger*> g_spdlog{nullptr};
std::once_flag g_default_once;
std::once_flag g_init_once;

std::string directory_of(const std::string& path) {
  std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Why `path` cannot be opened for appending ("" when it can), in the words of
// the report files' errors.  The file is opened (and closed) here with
// open(2), not by spdlog: spdlog would create missing parent directories,
// and its exception does not say why.  Like the report files, a log file is
// only created in a directory that exists.
std::string open_failure(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    return "";
  }
  const int err = errno;
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (err == EISDIR || (exists && S_ISDIR(st.st_mode))) return "it is a directory";
  if (exists && (err == EACCES || err == EPERM)) return "no permission to write it";
  return create_failure(err, directory_of(path));
}

spdlog::sink_ptr file_sink_or_null(const std::string& path, std::string* why) {
  *why = open_failure(path);
  if (!why->empty()) return nullptr;
  try {
    return std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}

void configure(const Config& config) {
  spdlog::sink_ptr sink;
  if (!config.log_file.empty()) {
    std::string path = expand_path_template(config.log_file, current_template_context());
    std::string why;
    sink = file_sink_or_null(path, &why);
    if (!sink) warn_stderr("cannot open log_file " + path + ": " + why + "; logging to stderr");
  }
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto* log = new spdlog::logger("cachalloc", std::move(sink));
  log->set_pattern(kPattern);
  log->set_level(spdlog::level::trace);  // Logger::should_log filters
  log->flush_on(spdlog::level::warn);
  g_spdlog.store(log, std::memory_order_release);  // the old one is leaked: someone may hold it
  g_logger.set_level(config.log_level);
}

spdlog::level::level_enum to_spdlog_level(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::err: return spdlog::level::err;
    case LogLevel::critical: return spdlog::level::critical;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

spdlog::logger& spdlog_logger() {
  spdlog::logger* log = g_spdlog.load(std::memory_order_acquire);
  if (log != nullptr) return *log;
  std::call_once(g_default_once, [] {
    spdlog::logger* expected = nullptr;
    g_spdlog.compare_exchange_strong(expected, make_stderr_logger());
  });
  return *g_spdlog.load(std::memory_order_acquire);
}

}  // namespace

constinit Logger g_logger;

void init_logging(const Config& config) {
  try {
    std::call_once(g_init_once, [&] { configure(config); });
  } catch (...) {
    // Keep the default logger; logging must never take the program down.
  }
}

void Logger::write(LogLevel level, std::string_view message) noexcept {
  if (!should_log(level)) return;
  try {
    spdlog_logger().log(to_spdlog_level(level), spdlog::string_view_t(message.data(), message.size()));
  } catch (...) {
    // Logging must never take the program down.
  }
}

void Logger::log_formatted(LogLevel level, fmt::string_view format, fmt::format_args args) noexcept {
  try {
    write(level, ::cachalloc::obs::vformat(format, args));
  } catch (...) {
    // A message that cannot be formatted (out of host memory) is dropped.
  }
}

void Logger::flush() noexcept {
  try {
    spdlog_logger().flush();
  } catch (...) {
  }
}

}  // namespace cachalloc::obs
