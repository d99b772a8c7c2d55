#!/bin/sh
# Builds the conformance suite's clients in other languages and prints
# the environment that turns their rows on (crates/vkernel/tests/
# conformance.rs, rows "C ABI" and "Python"):
#
#   eval "$(scripts/conformance-clients.sh OUTDIR [PYTHON])"
#
# The C client (examples/c/conformance_client.c) is linked statically
# against a release build of libvkernel installed under OUTDIR. PYTHON,
# if given, is an interpreter that can `import vkernel` (the Python
# client is python/tests/conformance_client.py).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: conformance-clients.sh OUTDIR [PYTHON]}
py=${2:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$root" && cargo build --release -q -p vkernel-c --lib) >&2
sh "$root/scripts/install-c.sh" --from "$root/target/release" "$out/prefix" >&2
pc="$out/prefix/lib/pkgconfig"
cflags=$(PKG_CONFIG_PATH=$pc pkg-config --cflags vkernel)
libs=$(PKG_CONFIG_PATH=$pc pkg-config --static --libs vkernel | sed 's/-lvkernel/-l:libvkernel.a/')
# shellcheck disable=SC2086
cc -O2 -Wall -Werror -o "$out/conformance_client" \
  "$root/examples/c/conformance_client.c" $cflags $libs >&2
echo "export VKERNEL_CONFORMANCE_C='$out/conformance_client'"
if [ -n "$py" ]; then
  echo "export VKERNEL_CONFORMANCE_PYTHON='$py $root/python/tests/conformance_client.py'"
fi
