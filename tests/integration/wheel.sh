#!/bin/sh
# wheel.sh — `pip install .` as a PyTorch user would run it: pyproject.toml
# builds a wheel (meson-python, only the shipped parts), pip installs it into
# a fresh virtual environment, and then, with no environment variable set,
#   - the `cachalloc` command preloads the wheel's own libcachalloc.so and
#     serves examples/driver_patterns on the fake driver,
#   - `cachalloc-report` reads the dump (`brief`, and `job` with its module),
#   - `import cachalloc` finds the wheel's library; __version__, the
#     library's cachalloc_version() and `cachalloc --version` agree.
#   wheel.sh SOURCE_DIR WHEEL_BUILD_DIR DRIVER_PATTERNS FAKE_LIBCUDA_DIR VERSION
# Debian's python3 with python3-venv and python3-mesonpy (scripts/
# install-deps.sh installs them); exit 77 without them.  pip runs offline
# (--no-index --no-build-isolation: the build tools are Debian's; --no-cache-dir:
# nothing left in ~/.cache/pip).
# WHEEL_BUILD_DIR keeps meson-python's build between runs.
set -u
src=$1 wheel_build=$2 example=$(realpath "$3") fake_dir=$4 version=$5
fail() { echo "wheel: FAIL: $*"; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] && "$py" -c 'import venv, ensurepip, mesonpy' 2>/dev/null \
  || { echo "wheel: SKIP (needs Debian's python3 with python3-venv and python3-mesonpy)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset PYTHONPATH CACHALLOC_LIBRARY CACHALLOC_CONF LD_PRELOAD

"$py" -m venv --system-site-packages "$tmp/venv" || fail "python3 -m venv"
start=$(date +%s)
"$tmp/venv/bin/pip" install --quiet --no-cache-dir --no-build-isolation --no-index \
  --config-settings "builddir=$wheel_build" "$src" >"$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log"; fail "pip install ."; }
echo "pip install . took $(( $(date +%s) - start )) s"
bin=$tmp/venv/bin
pkg=$("$bin/python" -c 'import cachalloc, os; print(os.path.dirname(cachalloc.__file__))') || fail "import cachalloc"
case $pkg in "$tmp/venv/"*) ;; *) fail "import cachalloc found $pkg, not the venv's" ;; esac
[ -f "$pkg/libcachalloc.so" ] || fail "no libcachalloc.so in the package ($pkg)"

# The command: preloads the wheel's library, reports the version.
[ "$("$bin/cachalloc" --version)" = "cachalloc $version" ] || fail "cachalloc --version: $("$bin/cachalloc" --version)"
preload=$("$bin/cachalloc" -- sh -c 'printf %s "$LD_PRELOAD"')
[ "$(realpath "$preload")" = "$(realpath "$pkg/libcachalloc.so")" ] || fail "cachalloc preloads '$preload'"
"$bin/cachalloc" --help | grep -q "^Documentation: $pkg/docs/README.md" || fail "cachalloc --help: docs path"
[ -f "$pkg/docs/README.md" ] || fail "docs not in the package"
for doc in "$src"/docs/*.md; do
  [ -f "$pkg/docs/docs/${doc##*/}" ] || fail "docs/${doc##*/} not in the package"
done

# Over the example on the fake driver: served from the cache.
cd "$tmp" || exit 1
LD_LIBRARY_PATH="$fake_dir" "$bin/cachalloc" --conf "stats:$tmp/dump.json" -- "$example" >"$tmp/run.log" 2>&1 \
  || { cat "$tmp/run.log"; fail "driver_patterns under the wheel's cachalloc"; }
"$bin/cachalloc-report" brief "$tmp/dump.json" >"$tmp/brief.txt" || fail "cachalloc-report brief"
cat "$tmp/brief.txt"
grep -q '^cachalloc intercepted [1-9][0-9]* device allocations' "$tmp/brief.txt" || fail "nothing intercepted"
grep -q '^[1-9][0-9]* of the [0-9]* allocations it served' "$tmp/brief.txt" || fail "nothing served from the cache"
# `job` imports its module from the package (issue 37 item 4): one dump,
# written with no rank variable set, shown by its pid.
"$bin/cachalloc-report" job "$tmp" >"$tmp/job.txt" 2>&1 || { cat "$tmp/job.txt"; fail "cachalloc-report job"; }
grep -q '^job: 1 dump (1 process without a rank)' "$tmp/job.txt" || { cat "$tmp/job.txt"; fail "cachalloc-report job: the job line"; }

# The module, with no environment variable: the library beside it, one version.
"$bin/python" - "$pkg" "$version" <<'PY' || fail "the module"
import os, sys
import cachalloc
pkg, version = sys.argv[1], sys.argv[2]
assert os.path.realpath(cachalloc.library_path()) == os.path.realpath(os.path.join(pkg, "libcachalloc.so")), cachalloc.library_path()
assert cachalloc.__version__ == version, cachalloc.__version__
assert cachalloc.library_version() == version, cachalloc.library_version()
assert cachalloc.stats() == {}  # loaded, nothing served in this process
print("module ok:", cachalloc.__version__, cachalloc.library_path())
PY
echo "ok"
