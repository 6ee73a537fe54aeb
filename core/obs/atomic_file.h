// atomic_file.h — writing a report file so that readers never see half of it.
//
// The content goes to a temporary file in the target's directory, created
// with O_CREAT|O_EXCL|O_NOFOLLOW (so it is always a fresh file we made), and
// is then renamed over the target.  A target that is a symbolic link is
// refused: cachalloc never writes through a link it did not create (rename
// would replace the link itself, but a user who put a link there meant
// something by it; one planted by someone else must not redirect the write:
// the check and the rename together never write through a link, even if one
// appears in between, because rename replaces a link, never its target).  A
// temporary name that is taken (left by a killed process, or planted) is
// skipped for the next one.  Nothing here throws or calls CUDA.
#pragma once

#include <string>
#include <string_view>

namespace cachalloc::obs {

// Returns true on success; otherwise false with a one-line reason in *error,
// in the user's terms ("directory /x does not exist", "no permission to
// create a file in directory /x", "it is a symbolic link, ..."), and no
// temporary file left behind.
bool atomic_write_file(const std::string& path, std::string_view content, std::string* error);

// Why a file could not be created in `dir` (errno `err` of open/mkstemp), in
// the same terms: "directory /x does not exist", "no permission to create a
// file in directory /x", ...; strerror's words for the rest.
std::string create_failure(int err, const std::string& dir);

// Whether a file could be created beside `path` now: creates and removes a
// temporary file in its directory.  "" if so, else create_failure()'s reason
// (from the real errno).  For report paths at start-up (issue 37).
std::string check_directory_writable(const std::string& path);

// One line "cachalloc: warning: <message>\n" straight to fd 2 (write(2), no
// buffering, no logger: works at exit and with log_level:off).
void warn_stderr(std::string_view message);

// Writes all of `text` to fd 2.
void write_stderr(std::string_view text);

}  // namespace cachalloc::obs
