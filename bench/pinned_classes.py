#!/usr/bin/env python3
"""pinned_classes.py — how much pinned memory each size-class policy wastes.

Issue 21 asks whether the pinned host cache's power-of-two classes
(HostCache::class_size) or finer ones waste less.  For a list of pinned
request sizes (a trace) this prints, per policy:

  pow2        the next power of two, at least one 4 KiB page (today's policy,
              PyTorch's CachingHostAllocator's)
  div2/4/8    2, 4 or 8 divisions per power of two, as roundup_power2_divisions
              does for device memory (PyTorch's roundup_power2_next_division),
              then up to whole pages (the driver pins pages)
  exact       the request rounded to pages: what the driver pins bare
  mixed       pow2 below 32 MiB, div4 from there (one of the per-interval
              settings roundup_power2_divisions allows: [32:1,>:4] in MiB
              terms), to see whether large requests alone gain

and for each: rounded bytes / requested bytes (1.00 = no waste), the number
of distinct classes the trace uses (fewer classes, more reuse), and — a
replay in which each request stays live until K later requests were made
(a loader's batches in flight, `--in-flight K`, default 4) and is then freed
into its class's free list — how many driver allocations the cache makes
(misses) and the peak of the bytes it pins (live + cached, no limit: the
replay never gives a block back).  A block serves only a request of
exactly its class, as in HostCache.

    bench/pinned_classes.py TRACE...              # one size per line, or a JSON list
    bench/pinned_classes.py --in-flight 8 TRACE
    bench/pinned_classes.py --write-testdata DIR  # the synthetic traces below

The synthetic traces (bench/testdata/pinned/, written by --write-testdata)
are shapes, not recordings: see SYNTHETIC below and docs/HOST.md ("Size
classes").
"""
import argparse
import json
import os
import random
import sys

PAGE = 4096
KiB, MiB = 1 << 10, 1 << 20


# --- policies ----------------------------------------------------------------

def round_up(n, to):
    return (n + to - 1) // to * to


def pow2(size):
    """HostCache::class_size: the next power of two, at least a page."""
    return max(PAGE, 1 << (size - 1).bit_length())


def divisions(n):
    """PyTorch's roundup_power2_next_division with `n` divisions, then pages."""
    def klass(size):
        if size & (size - 1) == 0:
            rounded = size
        else:
            floor = 1 << (size.bit_length() - 1)
            step = floor // n
            rounded = floor << 1 if step == 0 else round_up(size, step)
        return max(PAGE, round_up(rounded, PAGE))
    return klass


def exact(size):
    return round_up(size, PAGE)


def mixed(size, div4=divisions(4)):
    return pow2(size) if size < 32 * MiB else div4(size)


POLICIES = [("pow2", pow2), ("div2", divisions(2)), ("div4", divisions(4)), ("div8", divisions(8)),
            ("exact", exact), ("mixed", mixed)]


# --- measures ----------------------------------------------------------------

def waste(sizes, klass):
    """(rounded bytes / requested bytes, distinct classes)."""
    classes = [klass(s) for s in sizes]
    return sum(classes) / sum(sizes), len(set(classes))


def replay(sizes, klass, in_flight):
    """(driver allocations, peak pinned bytes): each request is live until
    `in_flight` later requests were made, then cached in its class."""
    free = {}        # class -> cached blocks
    live = []        # classes of live blocks, oldest first
    pinned = peak = misses = 0
    for s in sizes:
        c = klass(s)
        if free.get(c):
            free[c] -= 1
        else:
            misses += 1
            pinned += c
            peak = max(peak, pinned)
        live.append(c)
        if len(live) > in_flight:
            old = live.pop(0)
            free[old] = free.get(old, 0) + 1
    return misses, peak


def read_trace(path):
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        sizes = json.loads(text)
    else:
        sizes = [int(line.split("#")[0]) for line in text.splitlines() if line.split("#")[0].strip()]
    if not sizes or any(not isinstance(s, int) or s <= 0 for s in sizes):
        sys.exit(f"pinned_classes: {path}: expected positive integer sizes")
    return sizes


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def report(name, sizes, in_flight):
    print(f"{name}: {len(sizes)} requests, {human(sum(sizes))} requested")
    print(f"  {'policy':<7} {'rounded/requested':>17} {'classes':>8} {'driver allocs':>14} {'peak pinned':>12}")
    for pname, klass in POLICIES:
        ratio, n = waste(sizes, klass)
        misses, peak = replay(sizes, klass, in_flight)
        print(f"  {pname:<7} {ratio:>17.3f} {n:>8} {misses:>14} {human(peak):>12}")
    print()


# --- synthetic traces ----------------------------------------------------------
# SYNTHETIC: shapes a program pins, constructed here without a GPU; none is
# a recording.  Each list is in the order a program would ask.

def dataloader_images():
    """DataLoader(pin_memory=True) over ImageNet-sized data: per batch the
    image tensor (B x 3 x 224 x 224, float32 after ToTensor, or uint8 before
    normalization on the GPU) and the int64 labels; 20 full batches per
    (B, dtype), then the epoch's last partial batch (1,281,167 training
    images)."""
    sizes = []
    for dtype_bytes in (4, 1):
        for b in (32, 64, 128, 256):
            last = 1_281_167 % b or b
            for batch in [b] * 20 + [last]:
                sizes += [batch * 3 * 224 * 224 * dtype_bytes, batch * 8]
    return sizes


def dataloader_tokens(seed=21):
    """Token batches with dynamic padding (to the longest sequence of the
    batch, a multiple of 8, as HF's DataCollatorWithPadding
    pad_to_multiple_of=8): input_ids and attention_mask, int64, B in
    8..64, lengths up to 128..2048; 50 batches per (B, max length)."""
    rng = random.Random(seed)
    sizes = []
    for b in (8, 16, 32, 64):
        for max_len in (128, 512, 2048):
            for _ in range(50):
                longest = max(min(max_len, int(rng.lognormvariate(0, 0.6) * max_len / 3)) for _ in range(b))
                n = b * round_up(max(longest, 8), 8) * 8
                sizes += [n, n]
    return sizes


def numba_small():
    """numba's tests style: cuda.pinned_array / mapped_array of small
    shapes (10, 16, 100, (3, 4), 1000, 1024, 10**4, 2**16, 10**5) in int32,
    float32, float64, complex128."""
    sizes = []
    for itemsize in (4, 4, 8, 16):
        for n in (1, 10, 12, 16, 100, 1000, 1024, 10_000, 1 << 16, 100_000):
            sizes.append(n * itemsize)
    return sizes


def mpi_staging():
    """MPI/I/O staging through pinned buffers: OSU-benchmark message sizes,
    1 B .. 4 MiB in powers of two, each 10 times, and 4 MiB / 64 MiB
    pipeline chunks."""
    sizes = []
    for k in range(23):
        sizes += [1 << k] * 10
    return sizes + [4 * MiB] * 20 + [64 * MiB] * 4


SYNTHETIC = {"dataloader_images": dataloader_images, "dataloader_tokens": dataloader_tokens,
             "numba_small": numba_small, "mpi_staging": mpi_staging}


def write_testdata(directory):
    os.makedirs(directory, exist_ok=True)
    for name, make in SYNTHETIC.items():
        path = os.path.join(directory, name + ".txt")
        with open(path, "w") as f:
            f.write(f"# synthetic ({name}: bench/pinned_classes.py), not a recorded trace\n")
            f.writelines(f"{s}\n" for s in make())
        print(path)


def main(argv=None):
    p = argparse.ArgumentParser(description="Waste of pinned size-class policies on traces of request sizes.")
    p.add_argument("traces", nargs="*", help="files: one size per line (# comments), or a JSON list")
    p.add_argument("--in-flight", type=int, default=4, help="requests live at once in the replay (4)")
    p.add_argument("--write-testdata", metavar="DIR", help="write the synthetic traces to DIR and stop")
    args = p.parse_args(argv)
    if args.write_testdata:
        write_testdata(args.write_testdata)
        return 0
    if not args.traces:
        p.error("no trace given")
    all_sizes = []
    for path in args.traces:
        sizes = read_trace(path)
        all_sizes += sizes
        report(os.path.basename(path), sizes, args.in_flight)
    if len(args.traces) > 1:
        report("all traces together", all_sizes, args.in_flight)
    return 0


if __name__ == "__main__":
    sys.exit(main())
