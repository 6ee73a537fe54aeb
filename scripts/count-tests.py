#!/usr/bin/env python3
"""count-tests.py — the closing line of the test command: 'N passed, N failed'.

Reads meson's test log of each build directory given.  A Catch2 executable
counts as its TEST_CASEs (from the XML report it wrote to BUILD/catch-xml/);
any other meson test (a shell script, a small program) counts as one case.
Skipped tests (exit 77) are counted apart.  Exit status 1 if anything failed.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET


def catch2_cases(xml_path):
    """(passed, failed) TEST_CASEs in a Catch2 XML report, or None."""
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
    return passed, failed


def count_build(build_dir):
    log = os.path.join(build_dir, "meson-logs", "testlog.json")
    passed = failed = skipped = 0
    with open(log) as f:
        for line in f:
            entry = json.loads(line)
            result = entry.get("result")
            if result == "SKIP":
                skipped += 1
                continue
            xml = os.path.join(build_dir, "catch-xml", entry["name"].split("/")[-1].strip() + ".xml")
            cases = catch2_cases(xml) if os.path.exists(xml) else None
            if cases is not None and result in ("OK", "FAIL"):
                p, fl = cases
                # A crash after some cases passed still counts as a failure.
                if result == "FAIL" and fl == 0:
                    fl = 1
                passed += p
                failed += fl
            elif result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            else:
                failed += 1
    return passed, failed, skipped


def main(build_dirs):
    total = [0, 0, 0]
    for d in build_dirs:
        p, f, s = count_build(d)
        print(f"{os.path.basename(os.path.normpath(d))}: {p} passed, {f} failed, {s} skipped")
        total = [total[0] + p, total[1] + f, total[2] + s]
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
