#!/usr/bin/env python3
"""count-tests.py — the closing line of the test command: 'N passed, N failed'.

Reads meson's test logs: each argument is a build directory (its
meson-logs/testlog.json) or a log file itself (BUILD/meson-logs/NAME.json,
as `meson test --logbase NAME` writes it; scripts/test.sh runs several
configurations and gives each its own).  A Catch2 executable counts as its
TEST_CASEs (from the XML report it wrote to BUILD/catch-xml/); any other
meson test (a shell script, a small program, a fuzzing run) counts as one
case.  Skipped tests (exit 77) are counted apart, on the line before the
last.  `--failed WHAT` (repeatable) counts one failure for something that
produced no log (scripts/test.sh: a phase that could not configure or
build).  The last line is exactly 'N passed, N failed'.  Exit status 1 if
anything failed.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET


def catch2_cases(xml_path, failed_names=None):
    """(passed, failed) TEST_CASEs in a Catch2 XML report, or None; the
    failed cases' names are appended to failed_names."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    passed = failed = 0
    for case in root.iter("TestCase"):
        result = case.find("OverallResult")
        ok = result is not None and result.get("success") == "true"
        passed += ok
        failed += not ok
        if not ok and failed_names is not None:
            failed_names.append(case.get("name", "?"))
    return passed, failed


def log_and_build_dir(arg):
    """(test log, build directory) for a build directory or a log file."""
    if os.path.isdir(arg):
        return os.path.join(arg, "meson-logs", "testlog.json"), arg
    return arg, os.path.dirname(os.path.dirname(os.path.abspath(arg)))


def label(arg):
    """How a log is named in the per-log lines: build or build/testlog-asan."""
    log, build_dir = log_and_build_dir(arg)
    name = os.path.basename(os.path.normpath(build_dir))
    base = os.path.splitext(os.path.basename(log))[0]
    return name if base == "testlog" else f"{name}/{base}"


def count_build(arg, failures=None):
    """(passed, failed, skipped) of one log; each failure is appended to
    `failures` as 'test name: result [failed cases]' with its output's tail."""
    log, build_dir = log_and_build_dir(arg)
    passed = failed = skipped = 0
    with open(log) as f:
        for line in f:
            entry = json.loads(line)
            result = entry.get("result")
            if result == "SKIP":
                skipped += 1
                continue
            name = entry["name"].split("/")[-1].strip()
            xml = os.path.join(build_dir, "catch-xml", name + ".xml")
            names = []
            cases = catch2_cases(xml, names) if os.path.exists(xml) else None
            fl = 0
            if cases is not None and result in ("OK", "FAIL"):
                p, fl = cases
                # A crash after some cases passed still counts as a failure.
                if result == "FAIL" and fl == 0:
                    fl = 1
                passed += p
            elif result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            else:
                fl = 1
            failed += fl
            if fl and failures is not None:
                what = f"{name}: {result}" + (f" [{'; '.join(names)}]" if names else "")
                failures.append((what, entry.get("stdout") or ""))
    return passed, failed, skipped


def main(args):
    total = [0, 0, 0]
    i = 0
    while i < len(args):
        if args[i] == "--failed" and i + 1 < len(args):
            print(f"{args[i + 1]}: 0 passed, 1 failed (no test log)")
            total[1] += 1
            i += 2
            continue
        failures = []
        p, f, s = count_build(args[i], failures)
        print(f"{label(args[i])}: {p} passed, {f} failed, {s} skipped")
        # CI shows only the end of the output: each failure is named here,
        # with the last lines it printed.
        for what, out in failures:
            print(f"  FAILED {label(args[i])} / {what}")
            for tail in out.rstrip().splitlines()[-15:]:
                print(f"    | {tail}")
        total = [total[0] + p, total[1] + f, total[2] + s]
        i += 1
    print(f"{total[2]} skipped (exit 77: nothing to run here, e.g. no GPU)")
    print(f"{total[0]} passed, {total[1]} failed")
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
