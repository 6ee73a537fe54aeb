// tms_env.cpp — torch_memory_saver's environment variables, read once at
// start-up as TMS reads them, so that a program moved from TMS to
// cachalloc keeps its environment (slime starts its trainer with
// TMS_INIT_ENABLE=1 TMS_INIT_ENABLE_CPU_BACKUP=1 and allocates before any
// Python of TMS's runs).  docs/PAUSE.md "For torch_memory_saver users".
//
//   TMS_INIT_ENABLE=1             threads' allocations outside any region
//                                 are pausable, tag "default" (the
//                                 process's tag, CACHALLOC_CONF tag:default)
//   TMS_INIT_ENABLE_CPU_BACKUP=1  ... backed up in host memory, pinned or,
//   TMS_INIT_CPU_BACKUP_BACKEND   with "mmap", pageable (tag_cpu_backup)
//   TMS_INIT_ENABLE_DISK_BACKUP=1 ... backed up on disk (TMS refuses both
//                                 backups at once; here disk wins, warned)
//   TMS_RETAIN_CPU_BACKUP=1       host backups outlive the resume (every
//                                 tag; read at the first tag call, tags.cpp)
//   TMS_DISK_BACKUP_DIR           disk backups go there, in named files
//                                 (TMS's are named), the directory made
//   TMS_DISK_BACKUP_CHUNK_MB      the staging chunk of disk backups
//
// CACHALLOC_CONF wins where it says something, and so do the program's
// calls made before start-up (set_disk_backup_dir), as they follow TMS's
// reading of its environment.  A value TMS would abort on
// is named in a warning and ignored: nothing exits here.
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tags.h"

namespace cachalloc::shim {
namespace {

// tms_env_bool, with a warning for a value that is neither.
std::optional<bool> tms_bool(const char* name, std::vector<std::string>* warnings) {
  const std::optional<bool> v = tms_env_bool(name);
  if (!v && std::getenv(name) != nullptr)
    warnings->push_back(std::string(name) + "=" + std::getenv(name) +
                        " is neither true (1, true, yes) nor false (0, false, no): ignored");
  return v;
}

// The host backup TMS_INIT_CPU_BACKUP_BACKEND names ("pinned" or "mmap").
BackupMode host_backend(std::vector<std::string>* warnings) {
  const char* v = std::getenv("TMS_INIT_CPU_BACKUP_BACKEND");
  if (v == nullptr || *v == '\0' || std::string(v) == "pinned") return BackupMode::host;
  if (std::string(v) == "mmap") return BackupMode::pageable;
  warnings->push_back(std::string("TMS_INIT_CPU_BACKUP_BACKEND=") + v + " is neither pinned nor mmap: pinned");
  return BackupMode::host;
}

void apply_init_tag(Config& c, std::vector<std::string>* warnings) {
  if (tms_bool("TMS_INIT_ENABLE", warnings).value_or(false) && c.tag.empty()) c.tag = "default";
  const bool cpu = tms_bool("TMS_INIT_ENABLE_CPU_BACKUP", warnings).value_or(false);
  const bool disk = tms_bool("TMS_INIT_ENABLE_DISK_BACKUP", warnings).value_or(false);
  if (cpu && disk)
    warnings->push_back("TMS_INIT_ENABLE_CPU_BACKUP and TMS_INIT_ENABLE_DISK_BACKUP are both set "
                        "(torch_memory_saver refuses this): disk backups");
  if (c.tag_cpu_backup != BackupMode::none) return;  // CACHALLOC_CONF said
  if (disk) c.tag_cpu_backup = BackupMode::disk;
  else if (cpu) c.tag_cpu_backup = host_backend(warnings);
}

void apply_disk(Config& c, std::vector<std::string>* warnings) {
  if (const char* mb = std::getenv("TMS_DISK_BACKUP_CHUNK_MB"); mb != nullptr) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(mb, &end, 10);
    if (end != mb && *end == '\0' && n > 0) c.pause_backup_chunk = static_cast<std::size_t>(n) << 20;
    else warnings->push_back(std::string("TMS_DISK_BACKUP_CHUNK_MB=") + mb + " is not a positive number: ignored");
  }
  const char* dir = std::getenv("TMS_DISK_BACKUP_DIR");
  if (dir == nullptr || *dir == '\0' || !c.pause_backup_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // as TMS does; a failure shows at the pause
  set_backup_files_if_unset(dir, true);
}

}  // namespace

// TMS's get_bool_env_var: unset is nullopt (TMS aborts on another spelling).
std::optional<bool> tms_env_bool(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  const std::string s(v);
  if (s == "1" || s == "true" || s == "TRUE" || s == "yes" || s == "YES") return true;
  if (s == "0" || s == "false" || s == "FALSE" || s == "no" || s == "NO") return false;
  return std::nullopt;
}

std::vector<std::string> apply_tms_env(Config& c) {
  std::vector<std::string> warnings;
  apply_init_tag(c, &warnings);
  apply_disk(c, &warnings);
  tms_bool("TMS_RETAIN_CPU_BACKUP", &warnings);  // (read by the tags' registry, tags.cpp: warned here)
  return warnings;
}

}  // namespace cachalloc::shim
