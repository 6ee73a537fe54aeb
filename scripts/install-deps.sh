#!/usr/bin/env bash
# install-deps.sh — installs, from Debian's packages, whatever the build needs
# and this machine lacks: meson, ninja, a C++20 compiler, Catch2 v2, spdlog,
# fmt, binutils (readelf), python3.  The CUDA toolkit (headers, nvcc) is
# expected at /usr/local/cuda, as on every machine of this project.
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
[ ${#need[@]} -eq 0 ] && exit 0
echo "== installing from Debian: ${need[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
