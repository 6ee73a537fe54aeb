#!/usr/bin/env bash
# fetch-gpu-deps.sh — unpacks the header-only dependencies (Catch2 v2, spdlog,
# fmt, nlohmann-json for the tests) from Debian's packages into .deps/usr/include, for the GPU machine,
# which has no package registry.  Run it HERE (a Debian machine with apt),
# then carry .deps (gitignored) with the device call; scripts/gpu-check.sh
# points meson's deps_include at it.  Only usr/include is kept (a few MB).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.deps"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cd "$work"
apt-get download catch2 libspdlog-dev libfmt-dev nlohmann-json3-dev
rm -rf "$dest"
mkdir -p "$dest/unpacked"
for deb in ./*.deb; do
  dpkg -x "$deb" "$dest/unpacked"
done
mkdir -p "$dest/usr"
mv "$dest/unpacked/usr/include" "$dest/usr/include"
rm -rf "$dest/unpacked"

for header in catch2/catch.hpp spdlog/spdlog.h fmt/format.h nlohmann/json.hpp; do
  [[ -f "$dest/usr/include/$header" ]] || { echo "fetch-gpu-deps: $header missing after unpacking"; exit 1; }
done
echo "fetch-gpu-deps: headers in $dest/usr/include ($(du -sh "$dest" | cut -f1)):"
ls "$dest/usr/include"
