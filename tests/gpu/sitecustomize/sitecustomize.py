"""sitecustomize.py — put on PYTHONPATH by tests/gpu/run_numba_suites.py.

numba-cuda releases that predate NumPy 2.4 still name np.row_stack, which
NumPy 2.4 removed; give them the alias (np.vstack, which row_stack always
was) before any test imports numba.  Does nothing when NumPy is missing or
still has row_stack.
"""
try:
    import numpy as np

    np.row_stack = getattr(np, "row_stack", np.vstack)
except Exception:  # noqa: BLE001 - never break interpreter start-up
    pass
