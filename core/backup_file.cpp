// backup_file.cpp — DeviceBackend's file primitives for disk backups of
// paused tags (backend.h, pause_path.cpp), as plain POSIX calls.
//
// By default the file has no name from its first moment (O_TMPFILE; where
// a file system lacks it, mkostemp then unlink at once), so a process that
// dies leaves nothing on disk and nobody else can open it.  A named file
// (asked for by torch_memory_saver users, whose tools count the files in
// the directory) is mkostemp's, mode 0600, unlinked by the core when its
// backup goes.  O_CLOEXEC keeps either out of programs the process runs.  Its space is reserved up front (fallocate)
// so that a full disk fails the pause before gigabytes are copied; file
// systems without fallocate simply skip that.  Writes and reads go to known
// offsets (pwrite/pread: no shared file position), looping over partial
// transfers and EINTR; a transfer that makes no progress is an error.
// A file size limit (RLIMIT_FSIZE) is an error like a full disk: the kernel
// also sends SIGXFSZ, whose default action kills the process, so the
// calling thread blocks it around each call and takes the one its call
// raised (nothing exits inside someone else's process).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "backend.h"

namespace cachalloc {

namespace {

Status fail(std::string* why, std::string what, int err) {
  if (why != nullptr) *why = what + ": " + std::strerror(err);
  return kOperatingSystem;
}

// Runs call() (a system call: -1 and errno on failure) with SIGXFSZ
// blocked in this thread; a SIGXFSZ it raised (EFBIG) is taken, not left
// pending.  One already pending before is left alone.
template <typename Call>
auto without_sigxfsz(Call&& call) {
  sigset_t xfsz, old, pending;
  sigemptyset(&xfsz);
  sigaddset(&xfsz, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, &xfsz, &old);
  const bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1;
  const auto r = call();
  const int err = errno;
  if (r < 0 && err == EFBIG && !was_pending) {
    const timespec now{};
    sigtimedwait(&xfsz, nullptr, &now);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return r;
}

int create_unnamed(const char* dir) {
#ifdef O_TMPFILE
  const int fd = ::open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
#endif
  std::string path = std::string(dir) + "/cachalloc-pause-XXXXXX";
  const int named = ::mkostemp(path.data(), O_CLOEXEC);
  if (named >= 0) ::unlink(path.c_str());
  return named;
}

int create_named(const char* dir, std::string* path) {
  *path = std::string(dir) + "/cachalloc-backup-" + std::to_string(::getpid()) + "-XXXXXX";
  const int f = ::mkostemp(path->data(), O_CLOEXEC);
  if (f < 0) path->clear();
  return f;
}

}  // namespace

Status DeviceBackend::file_create(const char* dir, std::uint64_t size, int* fd, std::string* why, std::string* name) {
  std::string path;
  const int f = name == nullptr ? create_unnamed(dir) : create_named(dir, &path);
  if (f < 0) return fail(why, std::string("cannot create a backup file in ") + dir, errno);
  if (size != 0 && without_sigxfsz([&] { return ::fallocate(f, 0, 0, static_cast<off_t>(size)); }) != 0 &&
      errno != EOPNOTSUPP && errno != ENOSYS) {
    const int err = errno;
    if (!path.empty()) ::unlink(path.c_str());
    ::close(f);
    return fail(why, "cannot reserve " + std::to_string(size) + " bytes for a backup file in " + dir, err);
  }
  *fd = f;
  if (name != nullptr) *name = path;
  return kSuccess;
}

Status DeviceBackend::file_open(const std::string& path, int* fd, std::string* why) {
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) return fail(why, "cannot open the backup file " + path, errno);
  *fd = f;
  return kSuccess;
}

void DeviceBackend::file_unlink(const std::string& path) {
  if (!path.empty()) ::unlink(path.c_str());
}

Status DeviceBackend::file_write(int fd, const void* src, std::size_t size, std::uint64_t offset, std::string* why) {
  const auto* p = static_cast<const unsigned char*>(src);
  while (size > 0) {
    const ssize_t n = without_sigxfsz([&] { return ::pwrite(fd, p, size, static_cast<off_t>(offset)); });
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(why, "backup file write at offset " + std::to_string(offset), n < 0 ? errno : EIO);
    p += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return kSuccess;
}

Status DeviceBackend::file_read(int fd, void* dst, std::size_t size, std::uint64_t offset, std::string* why) {
  auto* p = static_cast<unsigned char*>(dst);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(why, "backup file read at offset " + std::to_string(offset), errno);
    if (n == 0) {
      if (why != nullptr) *why = "backup file read at offset " + std::to_string(offset) + ": short read (the file ends there)";
      return kOperatingSystem;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return kSuccess;
}

void DeviceBackend::file_close(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace cachalloc
