#!/bin/sh
# Builds the production binary as a user would ship it, and checks it:
# static (musl), stripped, without the bench's ZeroMQ and gRPC peers
# (--no-default-features), at most 15 MB, and working: an echo and a
# ping of that binary exchange 2,000 messages over loopback.
#
#   scripts/check-production.sh
#
# Needs the x86_64-unknown-linux-musl target (rustup) and musl-tools; it
# installs them if it can, else says so and exits 0 (as .ci/run's other
# optional toolchains do).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
target=x86_64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  rustup target add "$target" >/dev/null 2>&1 || { echo "the $target target is not installable here: skipped"; exit 0; }
fi
if ! command -v musl-gcc >/dev/null 2>&1 || ! command -v file >/dev/null 2>&1 || ! command -v strings >/dev/null 2>&1; then
  apt-get install -y -q musl-tools file binutils >/dev/null 2>&1 || { echo "musl-tools, file or binutils is not installable here: skipped"; exit 0; }
fi
cd "$root"
cargo build --locked --profile production --no-default-features -p vkernel-cli --target "$target"
bin=target/$target/production/vkernel
size=$(stat -c %s "$bin")
echo "production binary: $bin, $size bytes ($(file -b "$bin" | cut -d, -f1-5))"
file -b "$bin" | grep -q "static" || { echo "not statically linked"; exit 1; }
file -b "$bin" | grep -q "stripped" || { echo "not stripped"; exit 1; }
[ "$size" -le 15728640 ] || { echo "larger than 15 MB"; exit 1; }
if strings "$bin" | grep -q "zmq_msg_init"; then
  echo "libzmq is linked in"; exit 1
fi
out=$(mktemp)
"$bin" echo --bind 127.0.0.1:0 --exit-after 10s > "$out" &
echo_pid=$!
i=0
until grep -q listening "$out" 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 100 ] || { echo "echo did not start"; exit 1; }
  sleep 0.05
done
addr=$(sed -n 's/.* listening on \([^;]*\);.*/\1/p' "$out")
"$bin" ping --peer "$addr" -n 2000 | tee "$out.ping"
grep -q "failures 0" "$out.ping" || { echo "the exchange failed"; exit 1; }
kill -TERM "$echo_pid"
wait "$echo_pid"
rm -f "$out" "$out.ping"
echo "production binary ok"
