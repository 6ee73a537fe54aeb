# gpu-build.sh — sourced by the GPU scripts (gpu-check.sh, bench/run-all.sh,
# bench/record-traces.sh): how they configure a GPU build.
#   gpu_setup_args       fills the array setup_args: -Dbench=true, the
#                        carried headers, gpu_tests where nvcc is found
#   configure_build B L  meson setup of B (reconfigured when it exists,
#                        keeping its objects; wiped only if that fails),
#                        output in L; its exit status

gpu_setup_args() {
  setup_args=(-Dbench=true)
  # Meson refuses an absolute include path inside the source tree, so the
  # headers carried in .deps are copied to a fixed place outside it.
  if [[ -d .deps/usr/include ]]; then
    DEPS_COPY="${TMPDIR:-/tmp}/cachalloc-deps/include"
    if ! diff -rq .deps/usr/include "$DEPS_COPY" >/dev/null 2>&1; then  # unchanged: keep mtimes
      rm -rf "$DEPS_COPY" && mkdir -p "$DEPS_COPY" && cp -r .deps/usr/include/. "$DEPS_COPY/"
    fi
    setup_args+=("-Ddeps_include=$DEPS_COPY")
  else
    echo "no .deps/usr/include (scripts/fetch-gpu-deps.sh makes it): relying on system headers"
  fi
  if command -v nvcc >/dev/null 2>&1; then setup_args+=(-Dgpu_tests=enabled); fi
}

configure_build() {
  local build=$1 log=$2
  if [[ -f "$build/meson-private/coredata.dat" ]]; then
    timeout 120 meson setup --reconfigure "$build" "${setup_args[@]}" >"$log" 2>&1 ||
      timeout 120 meson setup --wipe "$build" "${setup_args[@]}" >"$log" 2>&1
  else
    timeout 120 meson setup "$build" "${setup_args[@]}" >"$log" 2>&1
  fi
}
