// test_pause_disk.cpp — disk backups of paused tags on the fake backend
// (core/pause_disk.cpp, docs/PAUSE.md): contents come back bit for bit
// over several cycles with blocks larger than the staging buffers and many
// small ones; host memory stays at the staging buffers; a failed file write
// fails the pause with the tag running and intact, a failed read fails the
// resume with the backup kept; nothing stays on disk; named files in a
// directory set at run time.  The file calls are real (POSIX, in a fresh
// directory); the fake fails them on cue.
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pause_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

constexpr std::size_t kChunk = 4 * MiB;  // each staging half

Config disk_config(const TempDir& dir, std::size_t chunk = kChunk) {
  Config c;
  c.pause_backup_dir = dir.path;
  c.pause_backup_chunk = chunk;
  return c;
}

struct Blocks {
  std::vector<std::pair<DevicePtr, std::size_t>> list;
  std::size_t bytes = 0;
};

// One block of 37 MiB (over four chunks and not a multiple of one), 300
// small blocks of odd sizes and a few medium ones, all in `tag`.
Blocks make_blocks(PauseFixture& f, TagId tag) {
  Blocks b;
  auto add = [&](std::size_t n) {
    b.list.emplace_back(f.tmalloc(n, tag), n);
    b.bytes += n;
  };
  add(37 * MiB + 12345);
  for (int i = 0; i < 300; ++i) add(512 + 97 * static_cast<std::size_t>(i));
  for (int i = 0; i < 5; ++i) add(3 * MiB + 4096 * static_cast<std::size_t>(i));
  return b;
}

void fill_all(PauseFixture& f, const Blocks& b, unsigned seed) {
  for (std::size_t i = 0; i < b.list.size(); ++i) f.fill(b.list[i].first, b.list[i].second, seed + static_cast<unsigned>(i));
}

bool all_hold(PauseFixture& f, const Blocks& b, unsigned seed) {
  for (std::size_t i = 0; i < b.list.size(); ++i)
    if (!f.holds(b.list[i].first, b.list[i].second, seed + static_cast<unsigned>(i))) return false;
  return true;
}

}  // namespace

TEST_CASE("disk backup: contents come back bit for bit over several cycles; host memory stays at the staging") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr u = f.malloc(1 * MiB);
  f.fill(u, 1 * MiB, 200);
  const Blocks w = make_blocks(f, kWeights);
  const std::size_t untagged_used = f.backend.used() - f.tag(kWeights).reserved_bytes;
  for (unsigned cycle = 0; cycle < 4; ++cycle) {
    INFO("cycle " << cycle);
    fill_all(f, w, 10 * cycle);  // new contents each time: each pause takes a fresh backup
    const int created = f.backend.files_created;
    f.backend.reset_peak_host_bytes();
    REQUIRE(f.pause(kWeights) == kSuccess);
    CHECK(f.backend.used() == untagged_used);  // the tag's pages went back
    CHECK(f.backend.files_created == created + 1);
    CHECK(f.backend.open_files() == 1);
    CHECK(dir.entries() == 0);    // the file has no name ...
    CHECK(dir.open_here() == 1);  // ... yet lives in the directory asked for
    const TagStats s = f.tag(kWeights);
    CHECK(s.backup_mode == BackupMode::disk);
    CHECK(s.backup_location == BackupMode::disk);
    CHECK(s.backup_bytes == s.allocated_bytes);  // the blocks (rounded sizes), all of them
    CHECK(s.backup_bytes >= w.bytes);
    CHECK(s.disk_bytes == s.backup_bytes);
    CHECK(s.disk_files == 1);
    CHECK(s.backup_capacity == 0);         // no host buffer of the tag's size
    CHECK(s.staging_bytes == 2 * kChunk);  // only the two staging halves
    CHECK(f.backend.live_host_bytes() == 2 * kChunk);
    CHECK(f.backend.peak_host_bytes() <= 2 * kChunk);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(all_hold(f, w, 10 * cycle));
    CHECK(f.backend.open_files() == 0);  // the file went at the resume, with its space
    CHECK(dir.open_here() == 0);
    CHECK(f.tag(kWeights).backup_location == BackupMode::none);
    CHECK(f.tag(kWeights).disk_bytes == 0);
    CHECK(f.backend.peak_host_bytes() <= 2 * kChunk);
  }
  CHECK(f.holds(u, 1 * MiB, 200));
  CHECK(f.tag(kWeights).pauses == 4);
  CHECK(f.tag(kWeights).resumes == 4);
  for (auto [p, n] : w.list) f.free(p);
  f.free(u);
  f.alloc.reset();
  CHECK(f.backend.live_host() == 0);  // the staging went with the allocator
  CHECK(dir.entries() == 0);
}

TEST_CASE("disk backup: a small tag pins staging of its own size, not the whole chunk") {
  TempDir dir;
  PauseFixture f(disk_config(dir, 64 * MiB));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(3 * MiB, kWeights);
  f.fill(w, 3 * MiB, 5);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(f.tag(kWeights).staging_bytes == 2 * 4 * MiB);  // 3 MiB rounded to 2 MiB pages, twice
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 3 * MiB, 5));
}

TEST_CASE("pause (disk backup): a failure at any driver or file call loses nothing and leaks nothing") {
  int n = 0;
  while (run_with_fault(n, false, BackupMode::disk, 10 * MiB)) ++n;
  CHECK(n > 12);  // with the staging's allocation, the file's create and writes, the copies
}

TEST_CASE("pause and resume (named disk backup files): a failure at any call loses nothing and leaks nothing") {
  for (bool in_resume : {false, true}) {
    int n = 0;
    while (run_with_fault(n, in_resume, BackupMode::disk, 10 * MiB, true)) ++n;
    CHECK(n > 12);
  }
}

TEST_CASE("resume (disk backup): a failure at any driver or file call loses nothing and leaks nothing") {
  int n = 0;
  while (run_with_fault(n, true, BackupMode::disk, 10 * MiB)) ++n;
  CHECK(n > 12);
}

TEST_CASE("disk backup: a failed file write fails the pause; the tag runs on with its contents; a retry works") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const Blocks w = make_blocks(f, kWeights);
  fill_all(f, w, 3);
  const std::size_t used = f.backend.used();
  const int last = static_cast<int>((f.tag(kWeights).allocated_bytes + kChunk - 1) / kChunk) - 1;
  for (int at : {0, 3, last}) {  // the first chunk, one in the middle, the last
    INFO("write " << at << " of " << last + 1 << " fails");
    f.backend.fail_file_write(at);
    CHECK(f.pause(kWeights) == kOperatingSystem);
    CHECK_FALSE(f.alloc->tag_paused(kWeights));
    CHECK(f.alloc->tag_failure(kWeights).find("No space left on device") != std::string::npos);
    CHECK(f.backend.used() == used);       // no page released
    CHECK(f.backend.open_files() == 0);    // the partial file is gone
    CHECK(f.tag(kWeights).backup_bytes == 0);
    CHECK(all_hold(f, w, 3));
    DevicePtr p = 0;  // still running: it allocates
    REQUIRE(f.alloc->malloc_tagged(&p, 1000, 0, kWeights) == kSuccess);
    f.free(p);
  }
  f.backend.fail_file_write(-1);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(f.alloc->tag_failure(kWeights).empty());
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(all_hold(f, w, 3));
  CHECK(f.backend.open_files() == 0);
}

TEST_CASE("disk backup: a failed file read fails the resume; the pages go again, the backup stays for a retry") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr u = f.malloc(1 * MiB);
  const Blocks w = make_blocks(f, kWeights);
  fill_all(f, w, 40);
  REQUIRE(f.pause(kWeights) == kSuccess);
  const std::size_t paused_used = f.backend.used();
  for (int at : {0, 5}) {
    INFO("read " << at << " fails");
    f.backend.fail_file_read(at);
    CHECK(f.resume(kWeights) == kOperatingSystem);
    CHECK(f.alloc->tag_paused(kWeights));
    CHECK(f.alloc->tag_failure(kWeights).find("Input/output error") != std::string::npos);
    CHECK(f.backend.used() == paused_used);  // the pages the resume mapped went again
    CHECK(f.backend.open_files() == 1);      // the backup is still there
    CHECK(f.tag(kWeights).disk_bytes == f.tag(kWeights).allocated_bytes);
    DevicePtr p = 0;
    CHECK(f.alloc->malloc_tagged(&p, 1000, 0, kWeights) == kTagPaused);
  }
  f.backend.fail_file_read(-1);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(all_hold(f, w, 40));
  CHECK(f.backend.open_files() == 0);
  f.free(u);
}

TEST_CASE("disk backup: a directory that does not exist fails the pause, saying which, with nothing lost") {
  Config c;
  c.pause_backup_dir = "/nonexistent-cachalloc-dir/backups";
  PauseFixture f(c);
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(10 * MiB, kWeights);
  f.fill(w, 10 * MiB, 8);
  CHECK(f.pause(kWeights) == kOperatingSystem);
  const std::string why = f.alloc->tag_failure(kWeights);
  CHECK(why.find("/nonexistent-cachalloc-dir/backups") != std::string::npos);
  CHECK(why.find("No such file or directory") != std::string::npos);
  CHECK_FALSE(f.alloc->tag_paused(kWeights));
  CHECK(f.holds(w, 10 * MiB, 8));
  f.alloc->set_tag_backup(kWeights, BackupMode::host);  // another way out: a host backup
  REQUIRE(f.pause(kWeights) == kSuccess);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 10 * MiB, 8));
}

TEST_CASE("disk backup: without pause_backup_dir the file goes to $TMPDIR") {
  TempDir dir;
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("TMPDIR", dir.path.c_str(), 1);
  {
    PauseFixture f;
    f.alloc->set_tag_backup(kWeights, BackupMode::disk);
    const DevicePtr w = f.tmalloc(5 * MiB, kWeights);
    f.fill(w, 5 * MiB, 9);
    REQUIRE(f.pause(kWeights) == kSuccess);
    CHECK(dir.open_here() == 1);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(dir.open_here() == 0);
    CHECK(f.holds(w, 5 * MiB, 9));
  }
  if (old != nullptr) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
}

TEST_CASE("disk backup: moving a tag between host and disk backups; a backup comes back from where it was taken") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  const DevicePtr w = f.tmalloc(20 * MiB, kWeights);
  f.fill(w, 20 * MiB, 1);
  f.alloc->set_tag_backup(kWeights, BackupMode::host);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(f.tag(kWeights).backup_location == BackupMode::host);
  CHECK(f.tag(kWeights).backup_capacity == 20 * MiB);
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);  // while paused: the host backup is still restored
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 20 * MiB, 1));
  f.fill(w, 20 * MiB, 2);
  REQUIRE(f.pause(kWeights) == kSuccess);  // now to disk: the host buffer is given back
  CHECK(f.tag(kWeights).backup_location == BackupMode::disk);
  CHECK(f.tag(kWeights).backup_capacity == 0);
  CHECK(f.backend.live_host_bytes() == 2 * kChunk);
  f.alloc->set_tag_backup(kWeights, BackupMode::host);  // while paused: the file is still read
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(w, 20 * MiB, 2));
  CHECK(f.backend.open_files() == 0);
  f.alloc->set_tag_backup(kWeights, BackupMode::none);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(f.backend.open_files() == 0);
  CHECK(f.tag(kWeights).backup_bytes == 0);
  REQUIRE(f.resume(kWeights) == kSuccess);
}

TEST_CASE("disk backup: a block freed while paused is not restored; the others are") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr a = f.tmalloc(30 * MiB, kWeights);
  const DevicePtr b = f.tmalloc(9 * MiB, kWeights);
  f.fill(a, 30 * MiB, 1);
  f.fill(b, 9 * MiB, 2);
  REQUIRE(f.pause(kWeights) == kSuccess);
  f.free(a);  // its whole pages are forgotten: the fake throws on a copy there
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.holds(b, 9 * MiB, 2));
  f.free(b);
}

TEST_CASE("disk backup: the file primitives (POSIX) write and read at offsets and say why they fail") {
  TempDir dir;
  FakeBackend be;
  std::string why;
  int fd = -1;
  CHECK(be.file_create("/nonexistent-cachalloc-dir", 100, &fd, &why, nullptr) == kOperatingSystem);
  CHECK(why.find("cannot create a backup file in /nonexistent-cachalloc-dir") != std::string::npos);
  REQUIRE(be.file_create(dir.path.c_str(), 3 * MiB, &fd, &why, nullptr) == kSuccess);
  struct stat st{};
  REQUIRE(::fstat(fd, &st) == 0);
  CHECK(st.st_nlink == 0);  // no name, from the start
  CHECK(dir.entries() == 0);
  std::vector<unsigned char> a(1 * MiB, 0xA5), b(2 * MiB, 0x3C), back(3 * MiB);
  REQUIRE(be.file_write(fd, b.data(), b.size(), 1 * MiB, &why) == kSuccess);  // out of order
  REQUIRE(be.file_write(fd, a.data(), a.size(), 0, &why) == kSuccess);
  REQUIRE(be.file_read(fd, back.data(), back.size(), 0, &why) == kSuccess);
  CHECK(std::equal(a.begin(), a.end(), back.begin()));
  CHECK(std::equal(b.begin(), b.end(), back.begin() + static_cast<std::ptrdiff_t>(a.size())));
  CHECK(be.file_read(fd, back.data(), 100, 3 * MiB - 50, &why) == kOperatingSystem);
  CHECK(why.find("short read") != std::string::npos);
  be.file_close(fd);
  CHECK(dir.open_here() == 0);

  // A write that stops part-way (the file size limit here, a full disk in
  // life): the part written is not taken for the whole.  SIGXFSZ keeps its
  // default action (kill): the calls must not let it through.
  REQUIRE(::signal(SIGXFSZ, SIG_DFL) != SIG_ERR);
  rlimit old{}, lim{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  lim = old;
  lim.rlim_cur = 1 * MiB;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  REQUIRE(be.file_create(dir.path.c_str(), 0, &fd, &why, nullptr) == kSuccess);
  std::string why_partial;
  const Status partial = be.file_write(fd, b.data(), b.size(), 0, &why_partial);  // 2 MiB: 1 MiB goes, then EFBIG
  const Status reserve = be.file_create(dir.path.c_str(), 2 * MiB, &fd, &why, nullptr);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  sigset_t pending;
  REQUIRE(::sigpending(&pending) == 0);
  CHECK(::sigismember(&pending, SIGXFSZ) == 0);  // taken, not left to kill us later
  CHECK(partial == kOperatingSystem);
  CHECK(why_partial.find("backup file write at offset 1048576: File too large") != std::string::npos);
  CHECK(reserve == kOperatingSystem);  // the space is reserved up front: fails before any copy
  CHECK(why.find("File too large") != std::string::npos);
  CHECK(dir.open_here() == 1);  // (the first file: the failed create left nothing)
  be.file_close(fd);
}

TEST_CASE("disk backup: threads allocate in other tags while a disk-backed tag pauses and resumes", "[threads]") {
  TempDir dir;
  PauseFixture f(disk_config(dir, 2 * MiB), 2 * GiB);
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(9 * MiB, kWeights);
  f.fill(w, 9 * MiB, 77);
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};  // (Catch's assertions are not thread-safe: counted here, checked after)
  auto worker = [&](TagId tag) {
    std::vector<DevicePtr> held;
    unsigned r = tag * 7919u + 1;
    while (!stop.load()) {
      r = r * 1103515245 + 12345;
      DevicePtr p = 0;
      if (f.alloc->malloc_tagged(&p, 512 + (r >> 8) % (3 * MiB), 0, tag) == kSuccess) held.push_back(p);
      else ++errors;
      if (held.size() > 6) {
        if (f.alloc->free(held.front()) != kSuccess) ++errors;
        held.erase(held.begin());
      }
    }
    for (DevicePtr p : held)
      if (f.alloc->free(p) != kSuccess) ++errors;
  };
  std::thread t1(worker, kUntagged), t2(worker, kKv);
  int cycle_errors = 0;
  for (int i = 0; i < 20; ++i) {
    cycle_errors += f.alloc->pause(kWeights) != kSuccess;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    cycle_errors += f.alloc->resume(kWeights) != kSuccess;
  }
  stop = true;
  t1.join();
  t2.join();
  CHECK(cycle_errors == 0);
  CHECK(errors == 0);
  f.alloc->validate();
  CHECK(f.holds(w, 9 * MiB, 77));
  CHECK(f.backend.open_files() == 0);
}

TEST_CASE("disk backup: an allocator destroyed while its tag is paused closes the file") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(12 * MiB, kWeights);
  f.fill(w, 12 * MiB, 4);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(dir.open_here() == 1);
  f.alloc.reset();  // (a context destroyed while paused; at process exit the kernel closes it)
  CHECK(f.backend.open_files() == 0);
  CHECK(dir.open_here() == 0);
  CHECK(dir.entries() == 0);
  CHECK(f.backend.live_host() == 0);
}

TEST_CASE("disk backup: double-buffered — chunk k crosses the bus while chunk k-1 crosses the file") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(3 * kChunk, kWeights);  // three chunks
  f.fill(w, 3 * kChunk, 6);
  f.backend.ops.clear();
  REQUIRE(f.pause(kWeights) == kSuccess);
  // Pause: copy 0, wait; copy 1, write 0 (copy 1 in flight), wait; copy 2,
  // write 1, wait; write 2 (and a last wait with nothing in flight).
  CHECK(f.backend.ops == "HSHWSHWSWS");
  f.backend.ops.clear();
  REQUIRE(f.resume(kWeights) == kSuccess);
  // Resume: read 0, wait (nothing), copy 0; read 1 (copy 0 in flight),
  // wait, copy 1; read 2, wait, copy 2; wait.
  CHECK(f.backend.ops == "RSDRSDRSDS");
  CHECK(f.holds(w, 3 * kChunk, 6));
}

TEST_CASE("disk backup: named files in a directory set at run time, one per block, gone at the resume") {
  TempDir configured, dir;
  PauseFixture f(disk_config(configured));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  f.alloc->set_backup_files(dir.path, true);
  const DevicePtr big = f.tmalloc(13 * MiB + 12345, kWeights);  // over three 4 MiB chunks
  const DevicePtr small = f.tmalloc(7, kWeights);
  f.fill(big, 13 * MiB + 12345, 1);
  f.fill(small, 7, 2);
  std::set<std::size_t> sizes;
  for (int cycle = 0; cycle < 3; ++cycle) {
    REQUIRE(f.pause(kWeights) == kSuccess);
    const std::vector<std::string> names = dir.names();
    CHECK(names.size() == 2);  // as torch_memory_saver: a file per allocation
    CHECK(f.tag(kWeights).disk_files == 2);
    CHECK(configured.entries() == 0);
    CHECK(f.backend.open_files() == 0);  // named files are closed between pause and resume
    std::size_t total = 0;
    for (const std::string& n : names) {
      CHECK(n.rfind("cachalloc-backup-" + std::to_string(::getpid()) + "-", 0) == 0);
      struct stat st {};
      REQUIRE(::stat((dir.path + "/" + n).c_str(), &st) == 0);
      CHECK((st.st_mode & 0777) == 0600);
      total += static_cast<std::size_t>(st.st_size);
    }
    CHECK(total == f.tag(kWeights).backup_bytes);  // the blocks' (rounded) sizes, no more
    sizes.insert(total);
    REQUIRE(f.resume(kWeights) == kSuccess);
    CHECK(dir.entries() == 0);
    CHECK(f.holds(big, 13 * MiB + 12345, 1));
    CHECK(f.holds(small, 7, 2));
  }
  CHECK(sizes.size() == 1);  // the same bytes on disk each cycle
  // A failed write takes its named files along; so does an allocator destroyed while paused.
  f.backend.fail_file_write(1);
  CHECK(f.pause(kWeights) == kOperatingSystem);
  CHECK(dir.entries() == 0);
  CHECK(f.backend.open_files() == 0);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(dir.entries() == 2);
  f.alloc.reset();
  CHECK(dir.entries() == 0);
}

TEST_CASE("disk backup: a tag of many blocks in named files holds one descriptor at a time") {
  TempDir dir;
  PauseFixture f(disk_config(dir));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  f.alloc->set_backup_files(dir.path, true);
  const Blocks w = make_blocks(f, kWeights);  // 306 blocks, one over four chunks
  fill_all(f, w, 50);
  f.backend.peak_open_files = 0;
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(dir.entries() == w.list.size());
  CHECK(f.backend.peak_open_files == 1);  // created and closed one by one, each written in its turn
  f.backend.fail_file_read(40);           // a failed read leaves the backup, its files and names, for a retry
  CHECK(f.resume(kWeights) == kOperatingSystem);
  CHECK(dir.entries() == w.list.size());
  CHECK(f.backend.open_files() == 0);
  REQUIRE(f.resume(kWeights) == kSuccess);
  CHECK(f.backend.peak_open_files == 1);
  CHECK(all_hold(f, w, 50));
  CHECK(dir.entries() == 0);
}

TEST_CASE("disk backup: set_backup_files(\"\") goes back to the configured directory, nameless") {
  TempDir configured, dir;
  PauseFixture f(disk_config(configured));
  f.alloc->set_tag_backup(kWeights, BackupMode::disk);
  const DevicePtr w = f.tmalloc(3 * MiB, kWeights);
  f.alloc->set_backup_files(dir.path, false);  // another directory, nameless files
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(dir.entries() == 0);
  CHECK(dir.open_here() == 1);
  REQUIRE(f.resume(kWeights) == kSuccess);
  f.alloc->set_backup_files("", false);
  REQUIRE(f.pause(kWeights) == kSuccess);
  CHECK(configured.open_here() == 1);
  CHECK(dir.open_here() == 0);
  REQUIRE(f.resume(kWeights) == kSuccess);
  f.free(w);
}
