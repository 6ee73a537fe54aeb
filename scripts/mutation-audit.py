#!/usr/bin/env python3
# mutation-audit.py — plants known bugs in the core, one at a time, and
# checks that the unit tests catch each (docs/RELIABILITY.md, "Mutation
# audit").
#
# Each mutant replaces one exact piece of source (which must occur exactly
# once: if the code moved on and it no longer does, the mutant is reported
# STALE, not run), rebuilds the tests it names, runs them (Catch2 filters
# keep the run short) and restores the file — always: in a `finally`, on
# SIGINT/SIGTERM, and at the start of the next run from the copy kept
# beside it (FILE.mutation-orig) should this process have been killed.
# A mutant is CAUGHT when a test fails (an assertion, validate(), or the
# fake backend throwing at a misuse), MISSED when every test passes.
# Nothing is committed; the tree is as before when it ends.
#
#   scripts/mutation-audit.py [-C build] [-j 2] [--all] [--list] [ID ...]
#
# --all runs every test of a mutant (to list all that catch it) instead of
# stopping at the first failure.  Builds run under `nice -n 10`.
import argparse
import os
import resource
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (test executable under tests/unit, Catch2 test spec or "" for all)
T = lambda exe, spec="": (exe, spec)

# id, file, what it plants, source before, source after, tests (first to fail
# wins), and "equivalent" for a mutant shown to change nothing observable
MUTANTS = [
    # ---------------------------------------------------------------- free path
    ("free-1", "core/free_path.h", "free treats a block other streams used as own-stream (missing stream check)",
     "const bool own_stream = block->stream_uses.empty() && fence_streams.empty();",
     "const bool own_stream = fence_streams.empty();",
     [T("test_streams"), T("test_reuse"), T("test_thread_cache")]),
    ("free-2", "core/ledger_events.cpp", "a parked block goes to its pool before its events complete",
     "  if (block->pending_events == 0) core_.deactivate(block);\n}",
     "  core_.deactivate(block);\n}",
     [T("test_streams"), T("test_reuse")]),
    ("free-3", "core/free_path.h", "count_free skips the requested_bytes update",
     "  stats_.requested_bytes.decrease(small, static_cast<std::int64_t>(block->requested));\n  if (block->size >= config_.max_split_size)",
     "  if (block->size >= config_.max_split_size)",
     [T("test_allocator"), T("test_stats")]),
    ("free-4", "core/free_path.cpp", "retire_stream leaves the thread caches' blocks of the stream unfenced",
     "  front_.flush(false);  // blocks cached on it wait too\n",
     "",
     [T("test_thread_cache"), T("test_streams")]),
    ("free-5", "core/front_path.cpp", "a cross-stream free through the thread-cache path records no use of that stream",
     "    block->stream_uses.push_back(stream);\n  return core_.free_found(block, {});",
     "    (void)stream;\n  return core_.free_found(block, {});",
     [T("test_thread_cache")]),
    ("free-6", "core/ledger_events.cpp", "the event queue completes a block one event early (off by one)",
     "  if (--block->pending_events != 0) return false;\n  core_.deactivate(block);",
     "  if (--block->pending_events > 1) return false;\n  core_.deactivate(block);",
     [T("test_streams"), T("test_reuse")]),
    # --------------------------------------------------------------- fence path
    ("fence-1", "core/ledger_fences.cpp", "poll_fences retires a fence that is not complete",
     "    const Status st = backend_->fence_query(f.fence);\n    if (st == kNotReady) break;\n    // An error other than not-ready: wait for the fence (or the device).",
     "    const Status st = backend_->fence_query(f.fence) == kNotReady ? kSuccess : kSuccess;\n    // An error other than not-ready: wait for the fence (or the device).",
     [T("test_fences"), T("test_fence_streams")]),
    ("fence-2", "core/ledger_fences.cpp", "join_fences hands fenced blocks out although the join failed",
     "  if (st == kNotSupported) joins_possible_ = false;\n  if (st != kSuccess) return false;",
     "  if (st == kNotSupported) joins_possible_ = false;",
     [T("test_fences"), T("test_fence_streams")]),
    ("fence-3", "core/ledger_fences.cpp", "a failed fence record completes the batch without synchronizing",
     "  if (backend_->synchronize_device() == kSuccess) {\n    ++stats_.num_sync_all_streams;\n    complete_batch(batch);",
     "  if (true) {\n    ++stats_.num_sync_all_streams;\n    complete_batch(batch);",
     [T("test_fences"), T("test_fence_streams")]),
    ("fence-4", "core/ledger_fences.cpp", "retire_fence forgets to take its bytes off fenced_bytes_",
     "  fenced_bytes_ -= f.bytes;\n",
     "",
     [T("test_fences"), T("test_fence_streams")]),
    ("fence-5", "core/free_path.cpp", "defer_live forgets to erase the block from the live map",
     "  live_.erase(block->ptr);\n  ledger_.defer(block);",
     "  ledger_.defer(block);",
     [T("test_fences")]),
    ("fence-6", "core/ledger_fences.cpp", "defer skips the num_deferred_frees count",
     "  ++stats_.num_deferred_frees;\n  stats_.deferred_free_bytes.increase",
     "  stats_.deferred_free_bytes.increase",
     [T("test_fences"), T("test_fence_streams")]),
    ("fence-7", "core/ledger_fences.cpp", "the join needs one free fewer than fence_join_frees (off by one)",
     "  if (small && (deferred_count_ + fenced_count_ < fence_join_frees_ ||",
     "  if (small && (deferred_count_ + fenced_count_ + 1 < fence_join_frees_ ||",
     [T("test_fences"), T("test_fence_streams")]),
    # ------------------------------------------------------------- thread cache
    ("tc-1", "core/thread_cache.h", "take() hands out the block its walk ends on, whatever its stream",
     "  if (b == nullptr || b->stream != stream || next_id == id_end) return nullptr;",
     "  if (b == nullptr || next_id == id_end) return nullptr;",
     [T("test_thread_cache")]),
    ("tc-2", "core/front_path.cpp", "adopt() takes a free that names another stream",
     "  if (!adoptable(block) || (stream != kAnyStream && stream != block->stream)) return false;",
     "  if (!adoptable(block)) return false;",
     [T("test_thread_cache")]),
    ("tc-3", "core/front_path.cpp", "adoptable() ignores streams recorded on the block",
     " && !block->exported && block->stream_uses.empty() &&",
     " && !block->exported &&",
     [T("test_thread_cache")]),
    ("tc-4", "core/front_path.cpp", "a thread's fences count as complete when polled",
     "    const Status st = core_.backend_->fence_query(f.fence);\n    if (st == kNotReady) {\n      ++core_.stats_.num_thread_fence_polls_not_ready;",
     "    const Status st = core_.backend_->fence_query(f.fence) == kNotReady ? kSuccess : kSuccess;\n    if (st == kNotReady) {\n      ++core_.stats_.num_thread_fence_polls_not_ready;",
     [T("test_thread_cache")]),
    ("tc-5", "core/front_path.cpp", "adoption skips the requested_bytes update",
     "  core_.stats_.requested_bytes.decrease(true, static_cast<std::int64_t>(block->requested));\n  return true;",
     "  return true;",
     [T("test_thread_cache")]),
    ("tc-6", "core/front_path.cpp", "detach leaves the block in the cache's out map",
     "  tc->erase_out(block);\n  tc->owned_bytes -= block->size;",
     "  tc->owned_bytes -= block->size;",
     [T("test_thread_cache")]),
    ("tc-7", "core/front_path.cpp", "the cache may own one block more than its limit (off by one)",
     "  if (tc->owned_bytes + block->size > tc->limit) return false;",
     "  if (tc->owned_bytes > tc->limit) return false;",
     [T("test_thread_cache")]),
    # --------------------------------------------------------------- host cache
    ("host-1", "core/host_cache.cpp", "poll_fences retires fences without asking whether they completed",
     "  while (!fences_.empty() && backend_->fence_query(fences_.front().fence) == kSuccess) {",
     "  while (!fences_.empty()) {",
     [T("test_host_cache")]),
    ("host-2", "core/host_cache.cpp", "non-portable blocks pooled without their owner (wrong owner)",
     "  return pools_[PoolKey{flags, portable ? 0 : owner}];",
     "  (void)portable;\n  return pools_[PoolKey{flags, 0}];",
     [T("test_host_cache")]),
    ("host-3", "core/host_cache.cpp", "class_size rounds 2^k+1 down to 2^k (off by one)",
     "  return std::bit_ceil(size);",
     "  return std::bit_ceil(size - 1);",
     [T("test_host_cache")]),
    ("host-4", "core/host_cache.cpp", "free forgets the pool's waiting count",
     "      ++b->pool->waiting[b->klass];\n",
     "",
     [T("test_host_cache")]),
    ("host-5", "core/host_cache.cpp", "free skips the requested_bytes update",
     "    stats_.requested_bytes.decrease(static_cast<std::int64_t>(b->requested));\n    if (trim_for(",
     "    if (trim_for(",
     [T("test_host_cache")]),
    ("host-6", "core/host_cache.cpp", "forget_owner leaves the owner's blocks on the waiting list",
     "  std::erase_if(waiting_, owned);\n",
     "",
     [T("test_host_cache")]),
    ("host-7", "core/host_cache_check.cpp", "the stats table reports cached_bytes as waiting_bytes",
     "  out.emplace_back(\"waiting_bytes\", s.waiting_bytes);",
     "  out.emplace_back(\"waiting_bytes\", s.cached_bytes);",
     [T("test_host_cache")]),
    # --------------------------------------------------------------- pause path
    ("pause-1", "core/pause_backup.cpp", "the host backup returns before its copies completed (pages released under them)",
     "  return backend_->copy_synchronize();\n}\n\nStatus CachingAllocator::read_host_backup",
     "  return kSuccess;\n}\n\nStatus CachingAllocator::read_host_backup",
     [T("test_pause"), T("test_pause_disk")]),
    ("pause-2", "core/pause_backup.cpp", "the restore returns before its copies completed",
     "  return backend_->copy_synchronize();\n}\n\n// Two pinned halves",
     "  return kSuccess;\n}\n\n// Two pinned halves",
     [T("test_pause"), T("test_pause_disk")]),
    ("pause-3", "core/pause_backup.cpp", "a disk chunk is written to the file before its copy completed",
     "    const Status synced = backend_->copy_synchronize();  // chunk k is in its half",
     "    const Status synced = kSuccess;  // chunk k is in its half",
     [T("test_pause_disk"), T("test_pause")]),
    ("pause-4", "core/pause_path.cpp", "pause backs up and releases without synchronizing the device",
     "  Status st = backend_->synchronize_device();\n  if (st != kSuccess) return st;\n  ++stats_.num_sync_all_streams;\n  ledger_.synchronize();",
     "  Status st = kSuccess;\n  ledger_.synchronize();",
     [T("test_pause"), T("test_pause_disk")]),
    ("pause-5", "core/pause_path.cpp", "release_page skips the reserved_bytes update",
     "  ++stats_.num_device_free;\n  stats_.reserved_bytes.decrease(seg->small, static_cast<std::int64_t>(seg->page));",
     "  ++stats_.num_device_free;",
     [T("test_pause"), T("test_pause_disk")]),
    ("pause-6", "core/pause_path.cpp", "a pause that failed before releasing anything leaves the tag paused",
     "      ts.paused = false;\n      drop_backup(ts);",
     "      drop_backup(ts);",
     [T("test_pause"), T("test_pause_disk")]),
    ("pause-8", "core/pause_backup.cpp", "the restore copies a block freed while paused into unmapped pages",
     "    if (b == nullptr || b->size != e.size) continue;\n",
     "",
     [T("test_pause"), T("test_pause_disk")]),
    ("pause-7", "core/pause_path.cpp", "forget_free_pages_of rounds a free block's last page up (off by one)",
     "      const std::size_t end = (b->ptr + b->size - seg->base) / seg->page;",
     "      const std::size_t end = (b->ptr + b->size - seg->base + seg->page - 1) / seg->page;",
     [T("test_pause"), T("test_pause_disk")], "equivalent"),
]

ORIG_SUFFIX = ".mutation-orig"


def restore_leftovers():
    """A killed run left a mutant in place: put the original back."""
    for f in sorted({m[1] for m in MUTANTS}):
        path = os.path.join(ROOT, f)
        if os.path.exists(path + ORIG_SUFFIX):
            os.replace(path + ORIG_SUFFIX, path)
            os.utime(path)
            print(f"restored {f} from a previous run's copy", file=sys.stderr)


def limit_memory():
    # A mutant can make a test loop and grow without bound (free-2 grew
    # test_reuse past 10 GB): the machine is shared, so 4 GiB of address
    # space per test, after which it fails (and counts as caught).
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run(cmd, timeout, test=False):
    try:
        r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           preexec_fn=limit_memory if test else None)
        return r.returncode, r.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode(errors="replace") + "\n(timed out)"


def failing_cases(out):
    """The failing Catch2 test cases named in a console report, in order
    (a long name wraps onto lines indented past its sections')."""
    lines = out.splitlines()
    names = []
    for i, line in enumerate(lines):
        if line.startswith("-" * 20) and i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].startswith("-"):
            if i > 0 and not lines[i - 1].startswith(("~", "=")) and lines[i - 1].strip():
                continue  # the closing rule of a header
            name = lines[i + 1].strip()
            for cont in lines[i + 2:]:
                if cont.startswith("-" * 20) or not cont.startswith("   "):
                    break
                name += " " + cont.strip()
            if name not in names:
                names.append(name)
    return names


def audit(m, args):
    mid, f, what, before, after, tests = m[:6]
    if m[6:] == ("equivalent",):
        # Kept in the list so that nobody plants it again expecting a catch:
        # it changes no behaviour any test (or program) can observe.
        return "EQUIVALENT", "not run: no observable change (RELIABILITY.md)"
    path = os.path.join(ROOT, f)
    src = open(path).read()
    if src.count(before) != 1:
        return "STALE", f"the original text occurs {src.count(before)} times"
    with open(path + ORIG_SUFFIX, "w") as o:
        o.write(src)
    try:
        with open(path, "w") as o:
            o.write(src.replace(before, after))
        targets = [f"tests/unit/{exe}" for exe in sorted({t[0] for t in tests})]
        rc, out = run(["nice", "-n", "10", "ninja", "-C", args.C, f"-j{args.j}"] + targets, 1800)
        if rc != 0:
            return "NO-BUILD", out[-2000:]
        caught = []
        for exe, spec in tests:
            cmd = [os.path.join(args.C, "tests/unit", exe)] + ([spec] if spec else [])
            t0 = time.time()
            rc, out = run(cmd, args.timeout, test=True)
            if rc != 0:
                cases = failing_cases(out)
                label = exe + (f' "{cases[0]}"' if cases else " (crashed)") + (f" (+{len(cases) - 1} more)" if len(cases) > 1 else "")
                caught.append(label + (" (timeout)" if rc == 124 else ""))
                if args.verbose:
                    print(out[-3000:])
                if not args.all:
                    break
            print(f"    {exe}: rc={rc} ({time.time() - t0:.1f} s)", file=sys.stderr)
        return ("CAUGHT", "; ".join(caught)) if caught else ("MISSED", "")
    finally:
        os.replace(path + ORIG_SUFFIX, path)  # the original, byte for byte
        os.utime(path)  # newer than the mutant's object, or ninja keeps that object


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-C", default="build")
    ap.add_argument("-j", default="2")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per test executable")
    ap.add_argument("--all", action="store_true", help="run every test of a mutant")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("ids", nargs="*")
    args = ap.parse_args()
    if args.list:
        for m in MUTANTS:
            print(f"{m[0]:8} {m[1]:26} {m[2]}")
        return 0
    # SIGTERM / SIGINT unwind through the finally that restores the file.
    def stop(sig, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    restore_leftovers()
    chosen = [m for m in MUTANTS if not args.ids or m[0] in args.ids]
    rows = []
    for m in chosen:
        print(f"== {m[0]}: {m[2]}", file=sys.stderr)
        result, by = audit(m, args)
        print(f"   {result} {by}", file=sys.stderr)
        rows.append((m[0], m[1], m[2], by, result))
    # Rebuild the restored sources, so the build dir is the tree's again.
    run(["nice", "-n", "10", "ninja", "-C", args.C, f"-j{args.j}"] +
        [f"tests/unit/{e}" for e in sorted({t[0] for m in chosen for t in m[5]})], 1800)
    print("| mutant | file | what it plants | caught by | result |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3] or '—'} | {r[4]} |")
    return 0 if all(r[4] in ("CAUGHT", "EQUIVALENT") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
