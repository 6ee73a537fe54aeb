#!/usr/bin/env python3
"""run_clients.py — runs the real clients bare and under libcachalloc.so.

Usage: run_clients.py --shim LIB.so [--only torch|cupy|cupy_ipc|jax|numba] [--out DIR] [--rows ROWS.tsv]

For each client (a script beside this one): skipped when its package is not
installed; else run once without the shim and once with LD_PRELOAD and
CACHALLOC_CONF=stats:DIR/<client>.json.  A client passes when both runs print
`<script>: PASS`, its RESULT lines are identical where the client promises
that (the PyTorch training step: bit-identical losses), and the dump shows
cachalloc served its allocations: calls of its allocation entry points
(cuMemAlloc_v2, cuMemAllocAsync, or cudaMalloc/cudaMallocAsync for shared cudart),
allocations counted by the core, and device allocations avoided.  A client
named in REQUIRED_LINES must also print that line in both runs (cupy_ipc:
the spawned importer's `cupy_ipc child: OK`).

Prints one line per client; --rows writes `name<TAB>status<TAB>figure` rows
for scripts/gpu-check.sh.  Exit 0 all passed (or skipped), 1 a failure,
77 every client skipped.
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import check_stats  # noqa: E402  (tests/gpu/check_stats.py)

# name: (script, module that must import, extra env, RESULT lines must match exactly)
CLIENTS = {
    "torch": ("torch_train_step.py", "torch", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
    "cupy": ("cupy_client.py", "cupy", {}, False),
    "cupy_ipc": ("cupy_ipc.py", "cupy", {}, False),
    "jax": ("jax_client.py", "jax", {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
                                     "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, False),
    "numba": ("numba_client.py", "numba", {}, False),
}
# name: a line both runs must print (besides `<script>: PASS`)
REQUIRED_LINES = {"cupy_ipc": "cupy_ipc child: OK"}
RUN_TIMEOUT = 100  # seconds per run; a training step takes well under 30


def run(script, env, log_path):
    """Runs one client; returns (exit code, stdout+stderr, seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, script)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=RUN_TIMEOUT)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or b""  # bytes here even with text=True
        out = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        rc, out = 124, out + f"\n(timed out after {RUN_TIMEOUT} s)\n"
    secs = time.monotonic() - t0
    with open(log_path, "w") as f:
        f.write(out)
    return rc, out, secs


def results(out):
    return [line for line in out.splitlines() if line.startswith("RESULT ")]


def passed(out, script):
    return f"{script[:-3]}: PASS" in out


def base_env(extra):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CACHALLOC_CONF")}
    env.update(extra)
    return env


def check_client(name, shim, out_dir):
    """Returns (status, figure) for one client."""
    script, module, extra, exact = CLIENTS[name]
    if importlib.util.find_spec(module) is None:
        return "SKIP", f"{module} not installed"
    bare_rc, bare_out, bare_s = run(script, base_env(extra), os.path.join(out_dir, f"{name}-bare.log"))
    if bare_rc == 77:
        return "SKIP", bare_out.strip().splitlines()[-1] if bare_out.strip() else "skipped"
    dump = os.path.join(out_dir, f"{name}.json")
    if os.path.exists(dump):
        os.remove(dump)
    env = base_env(extra)
    env["LD_PRELOAD"] = shim + (":" + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
    env["CACHALLOC_CONF"] = f"stats:{dump}"
    shim_rc, shim_out, shim_s = run(script, env, os.path.join(out_dir, f"{name}-shim.log"))

    problems = []
    if bare_rc != 0 or not passed(bare_out, script):
        problems.append(f"bare run failed (exit {bare_rc})")
    if shim_rc != 0 or not passed(shim_out, script):
        problems.append(f"run under the shim failed (exit {shim_rc})")
    required = REQUIRED_LINES.get(name)
    if required:
        for label, out in (("bare", bare_out), ("shim", shim_out)):
            if required not in out.splitlines():
                problems.append(f"{label} run did not print '{required}'")
    same = results(bare_out) == results(shim_out) and results(bare_out)
    if exact and not same:
        problems.append("RESULT lines differ between bare and shim runs")
    served = {}
    try:
        d = check_stats.load(dump)
        served = check_stats.summary(d)
        if served["alloc_calls"] == 0:
            problems.append("no allocation reached cachalloc")
        problems += check_stats.check(d, ["devices/0/stats/allocation.all.allocated>0",
                                          "devices/0/derived/device_allocations_avoided>0"])
    except (OSError, ValueError) as e:
        problems.append(f"no stats dump ({e.__class__.__name__})")

    figure = (f"results {'identical' if same else 'differ'}; "
              f"alloc calls={served.get('alloc_calls', '?')} "
              f"allocs={served.get('allocations', '?')} device_allocs={served.get('device_allocs', '?')} "
              f"avoided={served.get('avoided', '?')}; {shim_s:.1f} s vs {bare_s:.1f} s bare")
    for line in results(shim_out)[-2:]:
        print(f"    shim {line}")
    if problems:
        return "FAIL", "; ".join(problems) + " | " + figure
    return "PASS", figure


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--only", choices=sorted(CLIENTS))
    ap.add_argument("--out", default="client-runs")
    ap.add_argument("--rows")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shim = os.path.abspath(args.shim)
    names = [args.only] if args.only else list(CLIENTS)
    rows = []
    for name in names:
        print(f"--- client {name}", flush=True)
        status, figure = check_client(name, shim, args.out)
        print(f"client {name}: {status} {figure}", flush=True)
        rows.append((f"client {name}", status, figure))
    if args.rows:
        with open(args.rows, "w") as f:
            for r in rows:
                f.write("\t".join(r) + "\n")
    statuses = {r[1] for r in rows}
    if "FAIL" in statuses:
        return 1
    return 77 if statuses == {"SKIP"} else 0


if __name__ == "__main__":
    sys.exit(main())
