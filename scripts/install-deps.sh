#!/usr/bin/env bash
# install-deps.sh — installs, from Debian's packages, whatever the build needs
# and this machine lacks: meson, ninja, a C++20 compiler, Catch2 v2, spdlog,
# fmt, binutils (readelf), python3 (Debian's, /usr/bin/python3, with venv,
# meson-python and matplotlib: the wheel test and the plots), nlohmann-json
# (header-only, the C++ tests' JSON parser), and for scripts/test.sh's sanitizer and
# fuzzing phases clang with its runtimes (libFuzzer), gcc's ASan/UBSan/TSan
# runtimes and a static libc (the test wrapper tests/sanitize/preload_first.c
# is linked statically).  The CUDA toolkit (headers, nvcc) is expected at
# /usr/local/cuda, as on every machine of this project.
set -euo pipefail
need=()
command -v meson >/dev/null || need+=(meson)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3)
command -v readelf >/dev/null || need+=(binutils)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/catch2/catch.hpp ] || need+=(catch2)
[ -f /usr/include/spdlog/spdlog.h ] || need+=(libspdlog-dev)
[ -f /usr/include/fmt/format.h ] || need+=(libfmt-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
# Debian's interpreter, whatever python3 comes first on PATH: the modules
# below are Debian's packages, for /usr/bin/python3.
debian_py() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import $1" 2>/dev/null; }
debian_py 'venv, ensurepip' || need+=(python3-venv)
debian_py mesonpy || need+=(python3-mesonpy)
debian_py matplotlib || need+=(python3-matplotlib)
# gcc's sanitizer runtimes come with libgcc-*-dev (a dependency of g++);
# the static libc with libc6-dev.
[[ "$(gcc -print-file-name=libc.a 2>/dev/null)" == /* ]] || need+=(libc6-dev)
command -v clang >/dev/null && command -v clang++ >/dev/null || need+=(clang)
# -fsanitize=fuzzer links libclang_rt.fuzzer from libclang-rt-N-dev.
fuzzer_rt() { [ -f "$(clang --print-runtime-dir 2>/dev/null)/libclang_rt.fuzzer-$(uname -m).a" ]; }
command -v clang >/dev/null && fuzzer_rt || need+=(libclang-rt-dev)
[ ${#need[@]} -eq 0 ] && exit 0
echo "== installing from Debian: ${need[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
