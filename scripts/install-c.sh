#!/bin/sh
# Installs vkernel's C library: libvkernel.so (soname libvkernel.so.0),
# libvkernel.a, include/vkernel.h and lib/pkgconfig/vkernel.pc.
#
#   scripts/install-c.sh [--from TARGET_DIR] [PREFIX]
#
# PREFIX defaults to /usr/local. Without --from it builds the release
# library first (cargo build --release -p vkernel-c); with it, it installs
# what that cargo target directory (e.g. target/debug) already holds.
# Then: cc app.c $(pkg-config --cflags --libs vkernel)
#   (static: pkg-config --static --libs vkernel, with -l:libvkernel.a).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
from=""
if [ "${1:-}" = "--from" ]; then
  from=$2
  shift 2
fi
prefix=${1:-/usr/local}
if [ -z "$from" ]; then
  echo "building the C library (cargo build --release -p vkernel-c)..."
  (cd "$root" && cargo build --release -p vkernel-c)
  from="$root/target/release"
fi
for f in libvkernel_c.so libvkernel_c.a; do
  if [ ! -f "$from/$f" ]; then
    echo "install-c: $from/$f is missing (build vkernel-c first)" >&2
    exit 1
  fi
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 644 "$from/libvkernel_c.a" "$prefix/lib/libvkernel.a"
install -m 755 "$from/libvkernel_c.so" "$prefix/lib/libvkernel.so.0"
ln -sf libvkernel.so.0 "$prefix/lib/libvkernel.so"
install -m 644 "$root/crates/vkernel-c/include/vkernel.h" "$prefix/include/vkernel.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" \
  "$root/crates/vkernel-c/vkernel.pc.in" > "$prefix/lib/pkgconfig/vkernel.pc"
echo "installed libvkernel $version under $prefix (pkg-config: $prefix/lib/pkgconfig)"
