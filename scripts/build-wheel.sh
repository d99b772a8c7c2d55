#!/usr/bin/env bash
# Builds the Python package's wheel for manylinux2014 (glibc 2.17 and
# later: any x86_64 Linux of the last decade), checks that its tag is
# earned, and installs it in a fresh venv to run an exchange.
#
#   scripts/build-wheel.sh [OUT_DIR]     (default: target/wheels)
#
# A plain build here links against this machine's glibc (2.36 on Debian
# 12), whose symbol versions older systems lack. `maturin --zig` links
# against glibc 2.17's instead; maturin then refuses a wheel whose
# symbols exceed the tag, and auditwheel (PyPI) confirms it. One wheel
# serves CPython 3.11 and later (the stable ABI, abi3). Needs Python 3.11+
# with venv, Rust, and PyPI (maturin, ziglang, auditwheel).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/target/wheels}" && cd "${1:-$root/target/wheels}" && pwd)
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT

# The build tools' venv stays (as python/target does): the build cache
# holds only while zig's path is the same.
build=$root/target/wheel-tools
[ -x "$build/bin/pip" ] || python3 -m venv "$build"
"$build/bin/pip" install -q "maturin[zig]==1.16.0" "ziglang==0.17.1" "auditwheel==6.8.2"
rm -f "$out"/vkernel-*.whl
# (zig is found as `python3 -m ziglang`: the venv's. A target directory
# of its own, so that this build and `pip install ./python`, linked
# differently, do not rebuild each other's.)
PATH="$build/bin:$PATH" CARGO_TARGET_DIR="$root/target/wheel-build" maturin build --release --strip --zig --compatibility manylinux2014 \
  -m "$root/python/Cargo.toml" -o "$out"
wheel=$(ls "$out"/vkernel-*.whl)
case "$(basename "$wheel")" in
  *-cp311-abi3-*manylinux_2_17_x86_64*.whl) ;;
  *) echo "not a manylinux2014 wheel: $wheel" >&2; exit 1 ;;
esac

echo "== auditwheel show"
"$build/bin/auditwheel" show "$wheel" | tee "$tools/show"
# auditwheel names the most compatible tag the wheel's symbols allow.
if ! tr '\n' ' ' <"$tools/show" | grep -Eq '"manylinux_2_17_x86_64"'; then
  echo "auditwheel does not find $wheel consistent with manylinux_2_17" >&2
  exit 1
fi

echo "== the wheel in a fresh venv: an exchange"
python3 -m venv "$tools/try"
"$tools/try/bin/pip" install -q --no-index "$wheel"
# (From another directory, so the source tree's package is not the one imported.)
(cd "$tools" && "$tools/try/bin/python" - <<'EOF'
import threading
import vkernel

with vkernel.Kernel.start("127.0.0.1:0") as k:
    server, client = k.create_process(), k.create_process()

    def serve():
        msg, who = server.receive()
        server.reply(vkernel.Message(msg.code, msg[1] + 1), who.sender)

    t = threading.Thread(target=serve)
    t.start()
    reply, _ = client.send(vkernel.Message(1, 41), server.pid)
    t.join()
assert reply[1] == 42, reply
assert "site-packages" in vkernel.__file__, vkernel.__file__
print(f"vkernel {vkernel.__version__} from the wheel: reply {reply[1]}")
EOF
)
echo "built $wheel ($(du -k "$wheel" | cut -f1) KiB)"
