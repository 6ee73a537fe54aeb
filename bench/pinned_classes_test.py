#!/usr/bin/env python3
"""pinned_classes_test.py — the meson test `pinned_classes`: the policies of
bench/pinned_classes.py round as HostCache::class_size and PyTorch's
roundup_power2_next_division do, the replay counts misses and peaks as its
docstring says, both trace formats read, and bench/testdata/pinned/ is what
the generators write (so docs/HOST.md's figures come from the files).
    pinned_classes_test.py   (exit 0: pass)"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pinned_classes as pc  # noqa: E402

MiB = 1 << 20


def check_policies():
    assert pc.pow2(1) == 4096 and pc.pow2(4096) == 4096 and pc.pow2(4097) == 8192
    assert pc.pow2(147 * MiB) == 256 * MiB
    d4 = pc.divisions(4)
    assert d4(147 * MiB) == 160 * MiB           # 128 MiB + 32 MiB steps
    assert d4(128 * MiB) == 128 * MiB           # powers of two stay
    assert pc.divisions(8)(5000) == 8192        # 5120, then whole pages
    assert pc.divisions(2)(3 * MiB + 1) == 4 * MiB
    assert pc.mixed(20 * MiB) == 32 * MiB and pc.mixed(41 * MiB) == 48 * MiB
    assert pc.exact(5000) == 8192


def check_replay():
    # The first is freed once two later requests were made: the fourth
    # reuses it, after three driver allocations.
    assert pc.replay([5000, 5000, 5000, 5000], pc.pow2, 2) == (3, 3 * 8192)
    # Freed at once: the third request reuses the first; 9000 B is its own class.
    assert pc.replay([5000, 9000, 5000], pc.pow2, 0) == (2, 8192 + 16384)
    ratio, classes = pc.waste([5000, 9000], pc.pow2)
    assert classes == 2 and abs(ratio - (8192 + 16384) / 14000) < 1e-12


def check_reading():
    with tempfile.TemporaryDirectory() as d:
        lines, js = os.path.join(d, "a.txt"), os.path.join(d, "b.json")
        with open(lines, "w") as f:
            f.write("# comment\n100\n\n200  # trailing\n")
        with open(js, "w") as f:
            json.dump([100, 200], f)
        assert pc.read_trace(lines) == [100, 200] == pc.read_trace(js)


def check_testdata():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "pinned")
    for name, make in pc.SYNTHETIC.items():
        assert pc.read_trace(os.path.join(here, name + ".txt")) == make(), f"{name}.txt is stale: --write-testdata"
    images = pc.read_trace(os.path.join(here, "dataloader_images.txt"))
    assert round(pc.waste(images, pc.pow2)[0], 3) == 1.739  # docs/HOST.md, "Size classes"
    assert round(pc.waste(images, pc.divisions(4))[0], 3) == 1.090


if __name__ == "__main__":
    check_policies()
    check_replay()
    check_reading()
    check_testdata()
    print("ok")
