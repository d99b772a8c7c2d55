#!/bin/sh
# Builds the OCI image of deploy/Containerfile: the static production
# binary (x86_64-unknown-linux-musl, stripped, no bench peers) in an image
# FROM scratch.
#
#   scripts/build-image.sh [TAG]      # default localhost/vkernel:dev
#
# Uses podman if installed, else docker (set ENGINE to choose). Needs the
# musl target (rustup target add x86_64-unknown-linux-musl) and musl-tools.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
tag=${1:-localhost/vkernel:dev}
engine=${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
target=x86_64-unknown-linux-musl
cd "$root"
echo "building the static binary ($target, profile production)..."
cargo build --locked --profile production --no-default-features -p vkernel-cli --target "$target"
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "target/$target/production/vkernel" "$ctx/vkernel"
echo "building $tag with $engine..."
"$engine" build -q -f deploy/Containerfile -t "$tag" "$ctx" >/dev/null
echo "built $tag ($("$engine" image inspect --format '{{.Size}}' "$tag") bytes)"
