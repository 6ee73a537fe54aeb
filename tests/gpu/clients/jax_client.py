#!/usr/bin/env python3
"""jax_client.py — JAX with XLA's platform allocator (no BFC pool).

XLA_PYTHON_CLIENT_ALLOCATOR=platform makes XLA allocate each buffer from the
driver (cuMemAlloc_v2/cuMemFree_v2, looked up with dlsym on the libcuda
handle).  A jitted matmul + tanh, a gradient and many short-lived arrays,
each checked against NumPy.  Exit 77 without jax or GPU.
"""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print("jax_client: SKIP (jax not installed)")
    sys.exit(77)


def main():
    jax.config.update("jax_enable_x64", True)  # float64, to compare with numpy tightly
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        print(f"jax_client: SKIP (no GPU backend: {e})")
        return 77
    failures = []
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512))
    b = rng.standard_normal((512, 512))
    xa = jax.device_put(a, gpus[0])
    xb = jax.device_put(b, gpus[0])

    f = jax.jit(lambda x, y: jnp.tanh(x @ y).sum(axis=0))
    r = np.asarray(f(xa, xb))
    if not np.allclose(r, np.tanh(a @ b).sum(axis=0), rtol=1e-9, atol=1e-9):
        failures.append("jit(tanh(a @ b).sum) differs from numpy")

    # d/dw sum((x w)^2) = 2 x^T x w
    w = rng.standard_normal((512,))
    g = np.asarray(jax.grad(lambda w_: jnp.sum((xa @ w_) ** 2))(jnp.asarray(w)))
    if not np.allclose(g, 2 * a.T @ (a @ w), rtol=1e-9, atol=1e-7):
        failures.append("gradient differs from the analytic one")

    sizes = [1, 1000, 65_536, 1 << 20, 4 << 20]
    for i in range(200):
        n = sizes[i % len(sizes)]
        x = jnp.full((n,), i % 1000, dtype=jnp.int64)
        if int(x.sum()) != (i % 1000) * n:
            failures.append(f"sum of {n} x {i % 1000} wrong")
            break
        del x

    print(f"RESULT jit sum {float(r.sum())!r}")
    for msg in failures:
        print(f"  {msg}")
    print(f"jax_client: {'FAIL' if failures else 'PASS'} ({gpus[0].device_kind})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
