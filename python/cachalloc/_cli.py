"""The wheel's commands (pyproject.toml [project.scripts]).

``cachalloc``: the shell launcher scripts/cachalloc.in, installed beside
this file as ``cachalloc.sh`` with the library named relative to itself, so
the pip-installed command preloads the libcachalloc.so of this package.
``cachalloc-report``: scripts/cachalloc-report, installed as ``report.py``.
"""
import os
import sys


def launcher():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cachalloc.sh")
    os.execv("/bin/sh", ["/bin/sh", script] + sys.argv[1:])


def report():
    from cachalloc import report as tool

    sys.exit(tool.main())
