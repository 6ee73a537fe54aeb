"""A stand-in for the PyPI package `filecheck` (a Python FileCheck), which
numba-cuda's test helpers import at module level but which the GPU machine
does not have and cannot install (no package registry there).

run_numba_suites.py puts this directory on PYTHONPATH only when the real
package is missing, for the bare run and the cachalloc run alike.  Every use
raises unittest.SkipTest, so the few tests that check compiler output with
FileCheck are skipped, identically in both runs; no other test touches it.
"""
import unittest

REASON = "filecheck (PyPI) is not installed on this machine: FileCheck-based assertion skipped"


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise unittest.SkipTest(REASON)

    @classmethod
    def from_opts(cls, *args, **kwargs):
        raise unittest.SkipTest(REASON)


def _unavailable(*args, **kwargs):
    raise unittest.SkipTest(REASON)
