// atomic_file.cpp — see atomic_file.h.
#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace cachalloc::obs {

namespace {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// The directory part of `path` ("." when it has none), for messages.
std::string directory_of(const std::string& path) {
  std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// "<dir>/.<name>.tmp.<pid>.<n>": same directory, so rename() is atomic.
std::string temp_path_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  std::size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + name + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

}  // namespace

std::string create_failure(int err, const std::string& dir) {
  switch (err) {
    case ENOENT: {
      // procfs, sysfs and the like answer ENOENT for a new name in a
      // directory that exists: say what is true (issue 37).
      struct stat st {};
      if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        return "directory " + dir + " exists but does not allow creating files in it (creating one failed: " +
               std::strerror(err) + "; a virtual file system such as /proc or /sys?)";
      return "directory " + dir + " does not exist";
    }
    case EACCES:
    case EPERM: return "no permission to create a file in directory " + dir;
    case EROFS: return "directory " + dir + " is on a read-only file system";
    case ENOTDIR: return "a component of " + dir + " is not a directory";
    case ENAMETOOLONG: return "the path is too long";
    case ENOSPC:
    case EDQUOT: return "no space left in directory " + dir + " (disk full or quota exceeded)";
    default: return "cannot create a file in directory " + dir + ": " + std::strerror(err);
  }
}

namespace {

std::string reason(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string write_failure(int err, const std::string& dir) {
  if (err == ENOSPC || err == EDQUOT) return create_failure(err, dir);
  return std::string("writing failed: ") + std::strerror(err);
}

// Attempts with fresh names when one is taken: a temporary left behind by a
// process killed while writing (a container's pid is often the same from run
// to run) must not block every later report.
constexpr int kTempAttempts = 64;

}  // namespace

std::string check_directory_writable(const std::string& path) {
  const std::string dir = directory_of(path);
  for (int attempt = 0; attempt < kTempAttempts; ++attempt) {
    const std::string tmp = temp_path_for(path);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return "";
    }
    if (errno != EEXIST) return create_failure(errno, dir);
  }
  return "";  // every name taken: say nothing now, the write at exit will
}

bool atomic_write_file(const std::string& path, std::string_view content, std::string* error) {
  if (path.empty() || path.back() == '/') {
    *error = "not a file name";
    return false;
  }
  const std::string dir = directory_of(path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    *error = "it is a symbolic link, and cachalloc never writes through a link (it may have been planted by "
             "someone else); the link and what it points to are left untouched";
    return false;
  }
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < kTempAttempts && fd < 0; ++attempt) {
    tmp = temp_path_for(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    if (errno == EEXIST)  // every name tried was taken
      *error = "temporary files named ." + path.substr(path.rfind('/') + 1) + ".tmp.* already exist in " + dir;
    else
      *error = create_failure(errno, dir);
    return false;
  }
  bool ok = write_all(fd, content);
  if (!ok) *error = write_failure(errno, dir);
  if (::close(fd) != 0 && ok) {
    ok = false;
    *error = write_failure(errno, dir);
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    *error = errno == EISDIR ? std::string("it is a directory") : reason("replacing the file failed");
  }
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

void write_stderr(std::string_view text) { write_all(2, text); }

void warn_stderr(std::string_view message) {
  std::string line = "cachalloc: warning: ";
  line.append(message);
  line += '\n';
  write_all(2, line);
}

}  // namespace cachalloc::obs
