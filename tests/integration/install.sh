#!/bin/sh
# install.sh — what `meson install` gives C and C++ users: cachalloc.pc
# (pkg-config finds the header and the library), a program compiled and
# linked with those flags calling cachalloc_version(), one version string
# (meson's project version) from the library, the launcher and the Python
# package, the docs, `cachalloc --help` naming every CACHALLOC_CONF key
# of core/config.cpp's table, and cachalloc-report's `job` module found by
# both installed copies of the tool.
#   install.sh BUILD_DIR SOURCE_DIR VERSION
# Installs into a temporary DESTDIR; exit 77 without pkg-config or cc.
set -u
build=$1 src=$2 version=$3
fail() { echo "install: FAIL: $*"; exit 1; }
for tool in pkg-config cc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install: SKIP (no $tool)"; exit 77; }
done
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT

meson install -C "$build" --no-rebuild --destdir "$dest" >"$dest.log" 2>&1 \
  || { cat "$dest.log"; rm -f "$dest.log"; fail "meson install"; }
rm -f "$dest.log"

pc=$(find "$dest" -name cachalloc.pc)
[ -n "$pc" ] || fail "no cachalloc.pc installed"
export PKG_CONFIG_PATH="${pc%/*}" PKG_CONFIG_SYSROOT_DIR="$dest"
flags=$(pkg-config --cflags --libs cachalloc) || fail "pkg-config --cflags --libs cachalloc"
[ "$(pkg-config --modversion cachalloc)" = "$version" ] || fail "pkg-config --modversion: $(pkg-config --modversion cachalloc)"
echo "pkg-config: $flags"

cat >"$dest/use.c" <<'C'
#include <cachalloc.h>
#include <stdio.h>
int main(void) {
  printf("%s\n", cachalloc_version());
  return 0;
}
C
# shellcheck disable=SC2086  # the flags are words
cc "$dest/use.c" -o "$dest/use" $flags || fail "compiling and linking against cachalloc.pc's flags"
libdir=$(pkg-config --libs-only-L cachalloc | sed 's/^ *-L//; s/ *$//')
out=$(LD_LIBRARY_PATH="$libdir" "$dest/use") || fail "the linked program did not run"
[ "$out" = "$version" ] || fail "cachalloc_version() says '$out', meson says '$version'"

launcher=$(find "$dest" -path '*/bin/cachalloc')
[ -n "$launcher" ] || fail "no bin/cachalloc"
[ "$("$launcher" --version)" = "cachalloc $version" ] || fail "cachalloc --version: $("$launcher" --version)"
help=$("$launcher" --help) || fail "cachalloc --help exited $?"
keys=$(sed -n 's/^ *{"\([a-z_0-9]*\)", set_.*/\1/p' "$src/core/config.cpp")
[ -n "$keys" ] || fail "no keys read from core/config.cpp"
for key in $keys; do
  echo "$help" | grep -q "^  $key  " || fail "cachalloc --help does not list $key"
done
docs=$(echo "$help" | sed -n 's|^Documentation: \(.*\)/README.md .*|\1|p')
[ -f "$dest$docs/README.md" ] && [ -f "$dest$docs/docs/PYTORCH.md" ] || fail "docs not installed where --help says ($docs)"
# every doc of the tree (--help points to HOST.md and PAUSE.md too)
for doc in "$src"/docs/*.md; do
  [ -f "$dest$docs/docs/${doc##*/}" ] || fail "docs/${doc##*/} not installed"
done

init=$(find "$dest" -path '*/cachalloc/__init__.py')
[ -n "$init" ] || fail "no Python package installed"
grep -q "^__version__ = \"$version\"" "$init" || fail "the Python package's __version__ is not $version"

# cachalloc-report finds the module of its `job` command (issue 37 item 4)
# where it is installed: bin/, beside the command, and in the package, beside
# report.py.  A folder without dumps is the error every copy must reach.
report=$(find "$dest" -path '*/bin/cachalloc-report')
[ -n "$report" ] || fail "no bin/cachalloc-report"
mkdir "$dest/no-dumps"
for how in bin package; do
  if [ $how = bin ]; then
    out=$(python3 "$report" job "$dest/no-dumps" 2>&1)
  else
    out=$(PYTHONPATH="${init%/cachalloc/__init__.py}" python3 -m cachalloc.report job "$dest/no-dumps" 2>&1)
  fi
  rc=$?
  if [ $rc -ne 1 ] || ! echo "$out" | grep -q '^cachalloc-report: no cachalloc stats dump in'; then
    fail "installed cachalloc-report job ($how) exited $rc: $out"
  fi
done
echo "ok"
