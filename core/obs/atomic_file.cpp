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

// "<dir>/.<name>.tmp.<pid>.<n>": same directory, so rename() is atomic.
std::string temp_path_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  std::size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + name + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

std::string reason(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

bool atomic_write_file(const std::string& path, std::string_view content, std::string* error) {
  if (path.empty() || path.back() == '/') {
    *error = "not a file name";
    return false;
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    *error = "refusing to write through a symbolic link";
    return false;
  }
  std::string tmp = temp_path_for(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) {
    *error = reason("cannot create a temporary file");
    return false;
  }
  bool ok = write_all(fd, content);
  if (!ok) *error = reason("write failed");
  if (::close(fd) != 0 && ok) {
    ok = false;
    *error = reason("close failed");
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    *error = reason("rename failed");
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
