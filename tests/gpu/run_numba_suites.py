#!/usr/bin/env python3
"""run_numba_suites.py — numba-cuda's own test suites, bare and under libcachalloc.so.

Usage: run_numba_suites.py --shim LIB.so [--suite cudadrv|cudapy|both] [--out DIR]
                           [--rows ROWS.tsv] [--timeout SECONDS] [--budget SECONDS]
                           [--jobs N] [--concurrent]

Runs each suite twice, once without the shim and once with LD_PRELOAD=LIB.so
(CACHALLOC_CONF=stats:DIR/stats-<suite>-%p.json, one dump per process), and
compares the SETS of failing and erroring test ids: a suite passes only when
both runs completed (unittest printed "Ran N tests" and its OK/FAILED line)
and the two sets are identical.  Tests that fail bare (this machine, this
numba) are expected to fail the same way under the shim.

  cudadrv   python3 -m numba.runtests -v numba.cuda.tests.cudadrv
            (serially: its parallel mode crashes)
  cudapy    python3 -m numba.runtests -m JOBS -v numba.cuda.tests.cudapy
            (JOBS = --jobs, default 12; about 4 minutes on an H100)

Both runs get tests/gpu/sitecustomize on PYTHONPATH (np.row_stack for
numba-cuda releases older than NumPy 2.4), and tests/gpu/filecheck_stub when
the PyPI package `filecheck` is missing (its FileCheck assertions then skip).  --timeout caps each run (default
900 s); --budget (seconds for everything) splits what is left among the runs
still to come; a run cut short counts as not completed.  --concurrent runs a
suite's bare and shim runs at the same time (halves the wall time; both
compete for the GPU and the CPUs).

Prints one line per suite; --rows writes `name<TAB>status<TAB>figure` rows for
scripts/gpu-check.sh.  Exit 0 every suite passed, 1 a failure, 77 when numba
(with its CUDA test suites) or a GPU is missing.  Logs: DIR/<suite>-bare.log,
DIR/<suite>-shim.log.
"""
import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SITECUSTOMIZE = os.path.join(HERE, "sitecustomize")
# numba-cuda's test helpers import the PyPI package `filecheck`; where it is
# missing (the GPU machine cannot install it) a stand-in that skips the
# FileCheck-based assertions goes on the path, for both runs alike.
FILECHECK_STUB = os.path.join(HERE, "filecheck_stub")


def filecheck_path():
    try:
        import filecheck  # noqa: F401
        return []
    except ImportError:
        return [FILECHECK_STUB]
sys.path.insert(0, HERE)
import check_stats  # noqa: E402  (tests/gpu/check_stats.py)

SUITES = {
    "cudadrv": lambda jobs: ["-m", "numba.runtests", "-v", "numba.cuda.tests.cudadrv"],
    "cudapy": lambda jobs: ["-m", "numba.runtests", "-m", str(jobs), "-v", "numba.cuda.tests.cudapy"],
}

# --- parsing unittest's verbose output -------------------------------------
# A verbose result line: "test_x (pkg.mod.Class.test_x) ... ok" (Python >= 3.11
# names the method inside the parentheses, older ones only the class).  The
# outcome may follow on a later line when the test printed something or has a
# docstring.  Failures and errors are taken from the report blocks unittest
# prints at the end ("FAIL: test_x (pkg.mod.Class.test_x)"), which hold every
# one of them, subtests included, whatever the test wrote in between.
_START = re.compile(r"^\s*(?P<name>\w+) \((?P<where>[\w.]+)\)(?P<rest>.*)$")
_BLOCK = re.compile(r"^(?P<kind>FAIL|ERROR|UNEXPECTED SUCCESS): (?P<name>\w+) \((?P<where>[\w.]+)\)(?P<rest>.*)$")
_RAN = re.compile(r"^Ran (\d+) tests? in ")
_FINAL = re.compile(r"^(OK|FAILED)\b(?: \((.*)\))?\s*$")
_OUTCOMES = (("ok", "ok"), ("FAIL", "fail"), ("ERROR", "error"), ("skipped", "skipped"),
             ("expected failure", "expected_failure"), ("unexpected success", "unexpected_success"))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def test_id(name, where, rest=""):
    """pkg.mod.Class.test_x, whichever Python wrote it; a subtest keeps its
    parameters ("pkg.mod.Class.test_x (i=1)"), with object addresses in
    their reprs ("<object object at 0x7f...>") dropped: they differ from one
    process to the next."""
    full = where if where.endswith("." + name) else f"{where}.{name}"
    rest = _ADDRESS.sub("", rest.strip())
    return f"{full} {rest}" if rest else full


def parse(text):
    """Returns a dict: completed, ran, counts (from the verbose lines), summary
    (from the final line), failed (set of ids), errored (set of ids)."""
    counts = {v: 0 for _, v in _OUTCOMES}
    failed, errored = set(), set()
    ran, summary, completed = None, {}, False
    pending = False  # a test started and its outcome has not been seen yet

    def outcome(text):
        text = text.strip()
        for prefix, key in _OUTCOMES:
            if text.startswith(prefix):
                counts[key] += 1
                return True
        return False

    for line in text.splitlines():
        line = line.rstrip("\r")
        m = _BLOCK.match(line)
        if m:
            pending = False
            tid = test_id(m.group("name"), m.group("where"), m.group("rest"))
            if m.group("kind") == "ERROR":
                errored.add(tid)
            else:  # FAIL, and UNEXPECTED SUCCESS (which unittest counts as a failure of the run)
                failed.add(tid)
            continue
        m = _START.match(line)
        if m:
            rest = m.group("rest")
            pending = not (" ... " in rest and outcome(rest.split(" ... ", 1)[1]))
            continue
        if pending:  # the outcome after a docstring line or after the test's own output
            tail = line.split(" ... ", 1)[1] if " ... " in line else line
            if outcome(tail):
                pending = False
                continue
        m = _RAN.match(line)
        if m:
            ran = int(m.group(1))
            continue
        m = _FINAL.match(line)
        if m and ran is not None:
            completed = True
            summary = {"result": m.group(1)}
            for part in (m.group(2) or "").split(","):
                if "=" in part:
                    k, v = part.split("=", 1)
                    try:
                        summary[k.strip()] = int(v.strip())
                    except ValueError:
                        pass
    return {"completed": completed, "ran": ran, "counts": counts, "summary": summary,
            "failed": failed, "errored": errored}


# --- running -----------------------------------------------------------------
def base_env():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CACHALLOC_CONF")}
    paths = [SITECUSTOMIZE] + filecheck_path() + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def shim_env(shim, stats_pattern):
    env = base_env()
    env["LD_PRELOAD"] = shim + (":" + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
    env["CACHALLOC_CONF"] = f"stats:{stats_pattern}"
    return env


class Run:
    """One suite run in its own session (so a timeout kills every worker)."""

    def __init__(self, label, cmd, env, log_path):
        self.label, self.log_path = label, log_path
        self.log = open(log_path, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.rc, self.timed_out, self.secs = None, False, 0.0

    def wait(self, deadline):
        try:
            self.rc = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.rc = self.proc.wait()
        self.secs = time.monotonic() - self.t0
        self.log.close()
        with open(self.log_path, errors="replace") as f:
            self.result = parse(f.read())
        return self


def probe(env):
    """(ok, why): numba with its CUDA test suites imports and sees a GPU."""
    code = ("import importlib.util, sys\n"
            "try:\n"
            "    from numba import cuda\n"
            "except Exception as e:\n"
            "    print(f'numba.cuda does not import: {e}'); sys.exit(77)\n"
            "if importlib.util.find_spec('numba.cuda.tests.cudadrv') is None:\n"
            "    print('numba.cuda.tests is not installed'); sys.exit(77)\n"
            "if not cuda.is_available():\n"
            "    print('numba finds no CUDA GPU'); sys.exit(77)\n"
            "print('numba', __import__('numba').__version__, 'GPU', cuda.get_current_device().name)\n")
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False, "probing numba timed out"
    lines = p.stdout.strip().splitlines()
    last = lines[-1] if lines else f"exit {p.returncode}"
    return p.returncode == 0, last


def served(stats_glob):
    """Sums what cachalloc's per-process dumps say it served."""
    total = {"dumps": 0, "alloc_calls": 0, "avoided": 0}
    for path in glob.glob(stats_glob):
        try:
            s = check_stats.summary(check_stats.load(path))
        except (OSError, ValueError):
            continue
        total["dumps"] += 1
        total["alloc_calls"] += s["alloc_calls"]
        total["avoided"] += s["avoided"]
    return total


def describe(run):
    r = run.result
    bad = len(r["failed"]) + len(r["errored"])
    if not r["completed"]:
        how = "timed out" if run.timed_out else f"exit {run.rc}"
        return f"did not complete ({how}, {r['counts']['ok']} ok so far)"
    return (f"ran {r['ran']}, {r['counts']['ok']} ok, {len(r['failed'])} failed, {len(r['errored'])} errors, "
            f"{r['summary'].get('skipped', r['counts']['skipped'])} skipped, {run.secs:.0f} s")


def compare(suite, bare, shim, stats):
    """Returns (status, figure) for one suite."""
    problems = []
    for run in (bare, shim):
        if not run.result["completed"]:
            problems.append(f"{run.label} run did not complete")
    bare_bad = bare.result["failed"] | bare.result["errored"]
    shim_bad = shim.result["failed"] | shim.result["errored"]
    only_shim = sorted(shim_bad - bare_bad)
    only_bare = sorted(bare_bad - shim_bad)
    # Failing one way and erroring the other is a difference too.
    changed = sorted(((shim.result["failed"] ^ bare.result["failed"]) |
                      (shim.result["errored"] ^ bare.result["errored"])) - set(only_shim) - set(only_bare))
    if problems:  # a run cut short: its sets say nothing
        only_shim, only_bare, changed = [], [], []
    if only_shim or only_bare or changed:
        problems.append("failure/error sets differ")
    figure = f"bare: {describe(bare)}; shim: {describe(shim)}"
    if only_shim:
        figure += f"; only under the shim ({len(only_shim)}): " + ", ".join(only_shim[:6]) + \
                  (" ..." if len(only_shim) > 6 else "")
    if only_bare:
        figure += f"; only bare ({len(only_bare)}): " + ", ".join(only_bare[:6]) + \
                  (" ..." if len(only_bare) > 6 else "")
    if changed:
        figure += f"; FAIL vs ERROR ({len(changed)}): " + ", ".join(changed[:6]) + (" ..." if len(changed) > 6 else "")
    if not problems and bare_bad:
        figure += f"; the same {len(bare_bad)} fail both ways"
    figure += (f"; shim served {stats['alloc_calls']} allocation calls, avoided {stats['avoided']} device "
               f"allocations ({stats['dumps']} process dumps)")
    return ("FAIL" if problems else "PASS"), ("; ".join(problems) + " | " + figure if problems else figure)


def write_listing(path, run):
    with open(path, "w") as f:
        for kind in ("failed", "errored"):
            for tid in sorted(run.result[kind]):
                f.write(f"{kind}\t{tid}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shim", required=True)
    ap.add_argument("--suite", choices=["cudadrv", "cudapy", "both"], default="both")
    ap.add_argument("--out", default="numba-suites")
    ap.add_argument("--rows")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    ap.add_argument("--budget", type=float, help="seconds for all runs together")
    ap.add_argument("--jobs", type=int, default=12, help="worker processes for cudapy (default 12)")
    ap.add_argument("--concurrent", action="store_true", help="run bare and shim at the same time")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shim = os.path.abspath(args.shim)
    suites = ["cudadrv", "cudapy"] if args.suite == "both" else [args.suite]
    rows = []

    def emit_rows(code):
        if args.rows:
            with open(args.rows, "w") as f:
                for r in rows:
                    f.write("\t".join(r) + "\n")
        return code

    ok, why = probe(base_env())
    print(f"numba probe: {why}", flush=True)
    if not ok:
        rows.extend((f"numba suite {s}", "SKIP", why) for s in suites)
        return emit_rows(77)
    if not os.path.exists(shim):
        rows.extend((f"numba suite {s}", "FAIL", f"{shim} not found") for s in suites)
        return emit_rows(1)

    start = time.monotonic()
    runs_left = len(suites) * (1 if args.concurrent else 2)

    def deadline():
        nonlocal runs_left
        limit = args.timeout
        if args.budget is not None:
            left = args.budget - (time.monotonic() - start)
            limit = min(limit, left / max(runs_left, 1))
        runs_left -= 1
        return time.monotonic() + max(limit, 5.0)

    for suite in suites:
        cmd = [sys.executable] + SUITES[suite](args.jobs)
        stats_glob = os.path.join(os.path.abspath(args.out), f"stats-{suite}-*.json")
        for old in glob.glob(stats_glob):
            os.remove(old)
        stats_pattern = os.path.join(os.path.abspath(args.out), f"stats-{suite}-%p.json")
        print(f"--- numba suite {suite}: {' '.join(cmd[1:])}", flush=True)
        bare_log = os.path.join(args.out, f"{suite}-bare.log")
        shim_log = os.path.join(args.out, f"{suite}-shim.log")
        if args.concurrent:
            until = deadline()
            bare = Run("bare", cmd, base_env(), bare_log)
            shim_run = Run("shim", cmd, shim_env(shim, stats_pattern), shim_log)
            bare.wait(until)
            shim_run.wait(until)
        else:
            bare = Run("bare", cmd, base_env(), bare_log).wait(deadline())
            print(f"    bare: {describe(bare)}", flush=True)
            shim_run = Run("shim", cmd, shim_env(shim, stats_pattern), shim_log).wait(deadline())
        if args.concurrent:
            print(f"    bare: {describe(bare)}", flush=True)
        print(f"    shim: {describe(shim_run)}", flush=True)
        write_listing(os.path.join(args.out, f"{suite}-bare.failing.tsv"), bare)
        write_listing(os.path.join(args.out, f"{suite}-shim.failing.tsv"), shim_run)
        status, figure = compare(suite, bare, shim_run, served(stats_glob))
        print(f"numba suite {suite}: {status} {figure}", flush=True)
        rows.append((f"numba suite {suite}", status, figure))
    return emit_rows(1 if any(r[1] == "FAIL" for r in rows) else 0)


if __name__ == "__main__":
    sys.exit(main())
