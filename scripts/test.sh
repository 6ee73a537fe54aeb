#!/usr/bin/env bash
# test.sh — the README's test command: installs what is missing (Debian
# packages), builds, runs every test suite this machine can run (GPU tests
# skip themselves without a GPU), runs the unit suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer, and ends with the line
# 'N passed, N failed' counting test cases.
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh || { echo "could not install the build dependencies"; exit 1; }

jobs=$(nproc)
build() {  # build DIR [meson options...]
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  fi
  ninja -C "$dir" -j "$jobs" >"$dir.ninja.log" 2>&1 || { tail -50 "$dir.ninja.log"; return 1; }
}

status=0
echo "== build (build/)"
if build build; then
  echo "== tests: unit, integration, gpu, slow"
  meson test -C build --no-rebuild --print-errorlogs --num-processes "$jobs" \
    --suite unit --suite integration --suite gpu --suite slow || status=1
else
  status=1
fi

echo "== unit tests under ASan + UBSan (build-asan/)"
# Only the unit suite runs here, so only its programs are built: meson test
# builds what the selected tests need.
if [ -f build-asan/build.ninja ] ||
   meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false \
     -Dgpu_tests=disabled >build-asan.setup.log 2>&1; then
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    meson test -C build-asan --print-errorlogs --num-processes "$jobs" --suite unit || status=1
else
  cat build-asan.setup.log
  status=1
fi

echo "== summary"
dirs=()
[ -f build/meson-logs/testlog.json ] && dirs+=(build)
[ -f build-asan/meson-logs/testlog.json ] && dirs+=(build-asan)
python3 scripts/count-tests.py "${dirs[@]}" || status=1
exit $status
