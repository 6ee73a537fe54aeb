#!/usr/bin/env python3
"""signals_during_dump.py — signals arriving while cachalloc writes its
reports leave every report file complete (valid JSON) or absent, never half
written, and no temporary file behind; the process ends as the signal says.

Usage: signals_during_dump.py HOSTILE [--nested ROUNDS]   (run with the shim
preloaded, as meson does: the children get the LD_PRELOAD that this script
was started with, this interpreter itself runs without it).  --nested only
sends SIGTERM a few milliseconds after the snapshot signal, so that it often
arrives while the snapshot handler collects or writes (test
hostile_signals_nested): before shim/exit_hooks.cpp's handlers masked each
other's signals, the nested exit dump deadlocked on the allocator's lock or
corrupted the heap in about one round in four.  HOSTILE child_dump_target
builds a large state (20000 allocations, a long trace) and then either
exits (the harness sends SIGTERM or SIGINT at random moments of the exit
dump) or waits (the harness sends bursts of the snapshot signal while
reading the snapshot file, then SIGTERM).
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

# The preload is for the programs under test, not for this interpreter:
# under scripts/test.sh's sanitizer phases it holds the sanitizer's runtime
# too, whose leak checker would report the interpreter's own allocations at
# its exit.  Start again without it; the children get it back.
if "SIGNALS_CHILD_PRELOAD" not in os.environ:
    env = dict(os.environ, SIGNALS_CHILD_PRELOAD=os.environ.get("LD_PRELOAD", ""))
    env.pop("LD_PRELOAD", None)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
CHILD_ENV = dict(os.environ)
CHILD_ENV.pop("SIGNALS_CHILD_PRELOAD")
if os.environ["SIGNALS_CHILD_PRELOAD"]:
    CHILD_ENV["LD_PRELOAD"] = os.environ["SIGNALS_CHILD_PRELOAD"]

HOSTILE = sys.argv[1]
# Rounds of each exit signal during the exit dump.  SIGNALS_EXIT_ROUNDS
# (scripts/test.sh: fewer under the sanitizers, where one exit dump takes
# seconds) overrides the 12.
ROUNDS = int(os.environ.get("SIGNALS_EXIT_ROUNDS", "12"))


def fail(message):
    print("signals_during_dump: FAIL: " + message)
    sys.exit(1)


def check_files(directory, names, context):
    """Each report is absent or complete JSON; no temporary is left."""
    present = {}
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if entry.startswith("."):
            fail(f"{context}: a temporary file was left behind: {entry}")
        if entry not in names:
            fail(f"{context}: unexpected file {entry}")
        with open(path, "rb") as f:
            data = f.read()
        try:
            json.loads(data)
        except ValueError as e:
            fail(f"{context}: {entry} is not complete JSON ({len(data)} bytes): {e}")
        present[entry] = len(data)
    return present


def start(conf, how):
    env = dict(CHILD_ENV, CACHALLOC_CONF=conf)
    p = subprocess.Popen([HOSTILE, "child_dump_target", how], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if line != "ready\n":
        p.kill()
        fail(f"the target did not start: {line!r} {p.stderr.read()}")
    return p


def finish(p, allowed, context):
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"{context}: the process hung (deadlock in a signal handler?)")
    if p.returncode not in allowed:
        fail(f"{context}: exit status {p.returncode}, expected one of {allowed}; stderr: {err[-2000:]}")
    if "warning" in err:
        fail(f"{context}: {err[-2000:]}")
    return p.returncode


def conf_for(directory, extra=""):
    return (f"stats:{directory}/stats.json,snapshot:{directory}/snap.json,trace:{directory}/trace.json"
            + extra)


NAMES = {"stats.json", "snap.json", "trace.json"}


def measure_dump(directory):
    """Seconds from "exiting" to the end of the process (the exit dump)."""
    p = start(conf_for(directory), "exit")
    line = p.stdout.readline()
    t0 = time.monotonic()
    if line != "exiting\n":
        fail(f"no 'exiting' line: {line!r}")
    finish(p, (0,), "measure")
    elapsed = time.monotonic() - t0
    present = check_files(directory, NAMES, "measure")
    if set(present) != NAMES:
        fail(f"without a signal every report must be written: {present}")
    return elapsed


def signal_during_exit_dump(directory, sig, dump_seconds, rng):
    outcomes = {}
    for i in range(ROUNDS):
        for entry in os.listdir(directory):
            os.unlink(os.path.join(directory, entry))
        p = start(conf_for(directory), "exit")
        if p.stdout.readline() != "exiting\n":
            fail("no 'exiting' line")
        time.sleep(rng.uniform(0, dump_seconds * 1.2))
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass
        rc = finish(p, (0, -sig), f"{sig.name} round {i}")
        present = check_files(directory, NAMES, f"{sig.name} round {i}")
        # The report signals wait while reports are written: a signal never
        # cuts them short, so all of them are there, or (signal while the
        # state was being collected) none.
        if len(present) not in (0, len(NAMES)):
            fail(f"{sig.name} round {i}: the signal cut the reports short: only {sorted(present)} written")
        outcomes.setdefault((rc, len(present)), 0)
        outcomes[(rc, len(present))] += 1
    return outcomes


def read_snapshots(snap, seconds, until_first=False):
    """Reads the snapshot file over and over for SECONDS (or until the first
    read that finds it); each read must be complete JSON or find no file
    yet.  Returns the number of reads."""
    reads = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(snap, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        try:
            json.loads(data)
        except ValueError as e:
            fail(f"snapshot read mid-write is not complete JSON ({len(data)} bytes): {e}")
        reads += 1
        if until_first:
            break
    return reads


def snapshot_bursts(directory, rng, dump_seconds):
    """Bursts of the snapshot signal while the snapshot is read back; each
    read sees a complete file (the previous or the new one) or none yet.
    Each burst is read back for 0.3 s, or a third of the exit dump's time
    where that is longer: under ThreadSanitizer one snapshot of this state
    takes seconds, and six windows of 0.3 s could all end before the first
    one was renamed into place (CI on 435cde1: "wrote no snapshot")."""
    p = start(conf_for(directory, ",snapshot_signal:USR2"), "wait")
    snap = os.path.join(directory, "snap.json")
    window = max(0.3, dump_seconds / 3)
    reads = 0
    for burst in range(6):
        for _ in range(rng.randint(1, 8)):
            os.kill(p.pid, signal.SIGUSR2)
            time.sleep(rng.uniform(0, 0.01))
        reads += read_snapshots(snap, window)
    if reads == 0:
        # The signals were sent; a snapshot must follow within a few dumps'
        # time, or the snapshot signal does not work.
        reads = read_snapshots(snap, 3 * dump_seconds + 2, until_first=True)
    if reads == 0:
        fail("the snapshot signal wrote no snapshot")
    # Quiet again (the last snapshot written), then SIGTERM: the exit dump.
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGTERM)
    finish(p, (-signal.SIGTERM,), "snapshot bursts then SIGTERM")
    present = check_files(directory, NAMES, "snapshot bursts")
    if set(present) != NAMES:
        fail(f"SIGTERM after the bursts must write every report: {present}")
    return reads


def nested(rounds, rng):
    """SIGTERM a few milliseconds after the snapshot signal, so that it often
    arrives while the snapshot handler collects or writes."""
    with tempfile.TemporaryDirectory() as directory:
        for i in range(rounds):
            for entry in os.listdir(directory):
                os.unlink(os.path.join(directory, entry))
            p = start(conf_for(directory, ",snapshot_signal:USR2"), "wait")
            os.kill(p.pid, signal.SIGUSR2)
            time.sleep(rng.uniform(0, 0.03))
            os.kill(p.pid, signal.SIGTERM)
            finish(p, (-signal.SIGTERM,), f"nested round {i}")
            check_files(directory, NAMES, f"nested round {i}")
    print(f"{rounds} rounds of SIGTERM during a snapshot: ok")


def main():
    rng = random.Random(int(os.environ.get("SIGNALS_SEED", "12345")))
    if len(sys.argv) > 2 and sys.argv[2] == "--nested":
        rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 40
        nested(int(os.environ.get("SIGNALS_NESTED_ROUNDS", rounds)), rng)
        return
    with tempfile.TemporaryDirectory() as directory:
        dump_seconds = measure_dump(directory)
        for entry in os.listdir(directory):
            os.unlink(os.path.join(directory, entry))
        results = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            results[sig.name] = signal_during_exit_dump(directory, sig, dump_seconds, rng)
        for entry in os.listdir(directory):
            os.unlink(os.path.join(directory, entry))
        reads = snapshot_bursts(directory, rng, dump_seconds)
    print(f"exit dump takes {dump_seconds * 1000:.0f} ms; (status, reports present): count = {results}; "
          f"{reads} complete snapshot reads during bursts")
    print("ok")


if __name__ == "__main__":
    main()
