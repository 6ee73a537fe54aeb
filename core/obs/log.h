// log.h — cachalloc's own spdlog logger (issue 4, item 5).
//
// One logger per process, never registered in spdlog's global registry (so a
// program that uses spdlog itself is not disturbed), leaked on purpose so it
// still works inside atexit handlers and after static destructors.
// The logger writes to stderr or to Config::log_file and never allocates
// device memory or calls CUDA.  Hot paths log only at debug or below and
// guard the call with should_log() so a disabled level costs one load+compare:
//
//   if (obs::logger().should_log(spdlog::level::debug)) obs::logger().debug(...);
#pragma once

#include <spdlog/spdlog.h>

#include "config.h"

namespace cachalloc::obs {

// Configures the logger from config.log_level and config.log_file.  The first
// call wins; later calls do nothing (the shim calls it lazily when CUDA is
// first used).  If log_file cannot be opened, logs go to stderr and one
// warning says so.  Never throws.
void init_logging(const Config& config);

// The logger.  Usable before init_logging(): then it writes to stderr at the
// default level (warn).
spdlog::logger& logger();

// spdlog's level for a config LogLevel (exposed for tests).
spdlog::level::level_enum to_spdlog_level(LogLevel level);

}  // namespace cachalloc::obs
