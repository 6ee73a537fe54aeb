#!/usr/bin/env python3
"""gen_stream_calls.py — every driver entry point that names a stream, from
the toolkit's own headers, as wrappers that watch for per-thread default
streams (shim/stream_watch.h says why).

cudaTypedefs.h declares one PFN_<base>_v<version>[_ptsz|_ptds] typedef for
every ABI of every driver entry point, with its parameters: that is the
list of what cuGetProcAddress can hand out.  The exported name of each ABI is
the one cuda.h declares with exactly its parameter types (read through the
preprocessor with __CUDA_API_VERSION_INTERNAL, which declares the old ABIs
under the names libcuda exports them by); an ABI whose name is not certain
is wrapped for cuGetProcAddress only.

Usage (CC: the C compiler whose preprocessor reads cuda.h, default cc):
  gen_stream_calls.py --inc  CUDA_INCLUDE_DIR OUT.inc   the C++ wrappers and tables
  gen_stream_calls.py --exports CUDA_INCLUDE_DIR        exported names, one a line

An entry is wrapped when it is a per-thread variant (_ptsz, _ptds) or has a
CUstream parameter or a CUlaunchConfig (whose hStream names the stream).
Entry points the shim hooks for other reasons (hook_table.cpp) are left
out: their own hooks note the per-thread stream.  Old ABIs declared only
for the driver's internal build (__CUDA_API_VERSION_INTERNAL) are skipped.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

# Hooked in hook_table.cpp (by base name): not generated here.
HOOKED = {
    "cuMemAllocAsync", "cuMemFreeAsync", "cuStreamDestroy", "cuStreamBeginCapture",
    "cuStreamBeginCaptureToGraph", "cuStreamEndCapture", "cuGetProcAddress",
    "cuStreamSynchronize",  # progress_ops.h (notes the per-thread stream itself)
    "cuGraphInstantiateWithParams",  # graph_entry_points.cpp (notes hUploadStream)
}

PFN = re.compile(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(cu\w+?)_v(\d+)(_ptsz|_ptds)?\s*\)\s*\((.*)\)\s*;")
DEFINE_PT = re.compile(r"#\s*define\s+(cu\w+)\s+__CUDA_API_(PTSZ|PTDS)\((cu\w+)\)")
DEFINE_ALIAS = re.compile(r"#\s*define\s+(cu\w+)\s+(cu\w+)\s*$")


def split_params(text):
    """'A a, B (*f)(int, int), C c' -> ['A a', 'B (*f)(int, int)', 'C c']"""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return [p for p in out if p != "void"]


def param_name(p):
    m = re.search(r"(\w+)\s*(\[\s*\w*\s*\])?\s*$", p)
    return m.group(1)


def read_typedefs(path):
    """[(base, version, suffix, params)] outside __CUDA_API_VERSION_INTERNAL blocks."""
    entries, skip_depth, depth = [], None, 0
    for line in Path(path).read_text().splitlines():
        s = line.strip()
        if s.startswith("#if"):
            depth += 1
            if skip_depth is None and "__CUDA_API_VERSION_INTERNAL" in s:
                skip_depth = depth
            continue
        if s.startswith("#endif"):
            if skip_depth == depth:
                skip_depth = None
            depth -= 1
            continue
        if skip_depth is not None:
            continue
        m = PFN.search(s)
        if m:
            entries.append((m.group(1), int(m.group(2)), (m.group(3) or "")[1:], split_params(m.group(4))))
    return entries


def read_names(path):
    """base -> (plain exported name, per-thread exported name or None) for current ABIs."""
    names = {}
    for line in Path(path).read_text().splitlines():
        m = DEFINE_PT.search(line)
        if m:
            names[m.group(1)] = (m.group(3), m.group(3) + "_" + m.group(2).lower())
            continue
        m = DEFINE_ALIAS.search(line.strip())
        if m and m.group(1) not in names and not m.group(2).startswith("__"):
            names[m.group(1)] = (m.group(2), None)
    return names


def stream_checks(params, per_thread):
    """The C++ condition that says the call names the per-thread stream."""
    checks = []
    for p in params:
        name = param_name(p)
        if re.match(r"^(const\s+)?CUstream\s+\w+$", p):
            checks.append(f"{'names_per_thread_ptsz' if per_thread else 'names_per_thread'}({name})")
        elif re.match(r"^const\s+CUlaunchConfig\s*\*\s*\w+$", p):
            fn = "names_per_thread_ptsz" if per_thread else "names_per_thread"
            checks.append(f"{fn}(config_stream({name}))")
    return checks


def collect(inc_dir, cc):
    decls = read_declarations(inc_dir, cc)  # first: it reads the aliases
    typedefs = read_typedefs(Path(inc_dir) / "cudaTypedefs.h")
    names = read_names(Path(inc_dir) / "cuda.h")
    bases = sorted({b for b, _, _, _ in typedefs})
    ranks = {}
    for base, ver, suffix, _ in typedefs:
        ranks.setdefault((base, suffix), []).append(ver)
    entries, taken = [], set()
    for base, ver, suffix, params in typedefs:
        if base in HOOKED:
            continue
        per_thread = suffix != ""
        checks = stream_checks(params, per_thread)
        if suffix == "ptds":
            checks = ["true"]  # synchronous, on the per-thread stream by definition
        elif per_thread and not checks:
            checks = ["true"]
        if not checks:
            continue
        exported = exported_name(base, suffix, params, names, decls, sorted(ranks[(base, suffix)]).index(ver))
        if exported in taken:
            exported = None
        taken.add(exported)
        entries.append(dict(base=base, version=ver, suffix=suffix, params=params, checks=checks, exported=exported))
    return entries, bases


ALIASES = {}  # typedef name -> the type it names, where that is one identifier (cuda.h)


def canonical(word):
    seen = set()
    while word in ALIASES and word not in seen:
        seen.add(word)
        word = ALIASES[word]
    return word


def normalized_types(params):
    """Parameter types without names, each typedef alias followed to its end:
    comparable between cudaTypedefs.h (CUdeviceptr_v2) and cuda.h
    (CUdeviceptr), while the old ABIs' types (CUdeviceptr_v1) stay apart."""
    out = []
    for p in params:
        t = re.sub(r"\s*\b\w+\s*$", "", p) if re.search(r"[\w*]\s+\**\s*\w+\s*$", p) else p
        t = re.sub(r"\b\w+\b", lambda m: canonical(m.group(0)), t)
        out.append(re.sub(r"\s+", " ", t.replace("*", " * ")).strip())
    return tuple(out)


def read_declarations(inc_dir, cc):
    """exported name -> normalized parameter types, of every function cuda.h
    declares, old ABIs included (__CUDA_API_VERSION_INTERNAL names them as
    libcuda exports them)."""
    src = "#include <cuda.h>\n"
    text = subprocess.run(cc + ["-E", "-P", "-x", "c", "-D__CUDA_API_VERSION_INTERNAL", f"-I{inc_dir}", "-"],
                          input=src, capture_output=True, text=True, check=True).stdout
    for m in re.finditer(r"\btypedef\s+(?:struct\s+|enum\s+|union\s+)?(\w+)\s+(\w+)\s*;", text):
        ALIASES[m.group(2)] = m.group(1)
    decls = {}
    for m in re.finditer(r"\bCUresult\s+(cu\w+)\s*\(([^;{]*?)\)\s*;", text, re.S):
        decls.setdefault(m.group(1), normalized_types(split_params(" ".join(m.group(2).split()))))
    return decls


def exported_name(base, suffix, params, names, decls, rank):
    """The symbol libcuda exports for this ABI, or None where the headers do
    not say it for sure: a name of this base (cuFoo, cuFoo_v2, ... with the
    suffix) that cuda.h declares with exactly these parameter types.  Where
    two would fit, the one cuda.h maps the base name to wins; else none (a
    wrong guess would give the wrapper the wrong signature)."""
    want = normalized_types(params)
    tail = f"_{suffix}" if suffix else ""
    fits = [n for n in [base + tail] + [f"{base}_v{i}{tail}" for i in range(2, 10)] if decls.get(n) == want]
    if len(fits) == 1:
        return fits[0]
    # Several names of one signature (cuStreamWaitValue32 and _v2 differ in
    # meaning only): the ABIs' order is the names' order.  Any of them
    # forwards to the function of its own name, so the wrapper is right
    # whichever ABI claims it.
    by_rank = (base if rank == 0 else f"{base}_v{rank + 1}") + tail
    return by_rank if by_rank in fits else None


def ident(e):
    return f"w_{e['base']}_v{e['version']}{'_' + e['suffix'] if e['suffix'] else ''}"


def emit_inc(entries, bases, out):
    lines = ["// Generated by shim/gen_stream_calls.py from the toolkit's cudaTypedefs.h and cuda.h.",
             "// Do not edit: see stream_watch.cpp for the functions and types used here.", ""]
    for e in entries:
        i = ident(e)
        params = ", ".join(e["params"])
        args = ", ".join(param_name(p) for p in e["params"])
        cond = " || ".join(e["checks"])
        watch = "note_per_thread_stream()" if cond == "true" else f"if ({cond}) [[unlikely]] note_per_thread_stream()"
        pfn = f"PFN_{e['base']}_v{e['version']}{'_' + e['suffix'] if e['suffix'] else ''}"
        lines.append(f"static Slots {i}_slots;")
        lines.append(f"static CUresult {i}_proc({params}) {{")
        lines.append(f"  {watch};")
        lines.append(f"  auto real = reinterpret_cast<{pfn}>({i}_slots.proc.load(std::memory_order_relaxed));")
        lines.append(f"  return real({args});")
        lines.append("}")
        if e["exported"]:
            # An asm label: cuda.h's macros and declarations rename or
            # retype these names, the exported symbol must be exactly this.
            lines.append(f"EXPORT CUresult {i}_export({params}) __asm__(\"{e['exported']}\");")
            lines.append(f"CUresult {i}_export({params}) {{")
            lines.append(f"  {watch};")
            lines.append(f"  auto real = reinterpret_cast<{pfn}>(resolve_dl({i}_slots, \"{e['exported']}\"));")
            lines.append("  if (real == nullptr) [[unlikely]] return CUDA_ERROR_NOT_FOUND;")
            lines.append(f"  return real({args});")
            lines.append("}")
    lines.append("")
    lines.append("namespace cachalloc::shim {")
    lines.append("// base, first cudaVersion of the ABI, per-thread variant, exported name (current ABI")
    lines.append("// only, else nullptr), exported wrapper, lookup wrapper, slots.  Sorted by base.")
    lines.append("const WatchedCall kWatchedCalls[] = {")
    for e in sorted(entries, key=lambda e: (e["base"], e["suffix"] != "", -e["version"])):
        i = ident(e)
        exp = f"\"{e['exported']}\"" if e["exported"] else "nullptr"
        fn = f"reinterpret_cast<void*>(&::{i}_export)" if e["exported"] else "nullptr"
        lines.append(f"    {{\"{e['base']}\", {e['version']}, {str(e['suffix'] != '').lower()}, {exp}, {fn}, "
                     f"reinterpret_cast<void*>(&{i}_proc), &{i}_slots}},")
    lines.append("};")
    lines.append("// Every base name cudaTypedefs.h declares (sorted): a lookup of any other name is of an")
    lines.append("// entry point newer than these headers.")
    lines.append("const char* const kKnownBases[] = {")
    for b in bases:
        lines.append(f"    \"{b}\",")
    lines.append("};")
    lines.append("}  // namespace cachalloc::shim")
    Path(out).write_text("\n".join(lines) + "\n")


def main(argv):
    cc = shlex.split(os.environ.get("CC", "cc"))
    if len(argv) >= 3 and argv[1] == "--exports":
        entries, _ = collect(argv[2], cc)
        for name in sorted({e["exported"] for e in entries if e["exported"]}):
            print(name)
        return 0
    if len(argv) == 4 and argv[1] == "--inc":
        entries, bases = collect(argv[2], cc)
        emit_inc(entries, bases, argv[3])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
