#!/bin/sh
# Installs the vkernel command with its manual pages, shell completions,
# systemd units and example configuration.
#
#   scripts/install-cli.sh [--from BINARY] [PREFIX]
#
# PREFIX defaults to /usr/local. Without --from it builds and installs the
# production binary (stripped, without the bench's ZeroMQ and gRPC peers)
# with `cargo install --locked --profile production --no-default-features
# --path crates/vkernel-cli --root PREFIX`; with it, it copies that
# already-built binary. Then it writes:
#   PREFIX/bin/vkernel
#   PREFIX/share/man/man1/vkernel.1, vkernel-COMMAND.1
#   PREFIX/share/bash-completion/completions/vkernel
#   PREFIX/share/zsh/site-functions/_vkernel
#   PREFIX/share/fish/vendor_completions.d/vkernel.fish
#   PREFIX/lib/systemd/system/vkernel-*.service (ExecStart=PREFIX/bin/vkernel)
#   PREFIX/share/vkernel/vkernel.toml (the example; /etc is left alone)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
from=""
if [ "${1:-}" = "--from" ]; then
  from=$2
  shift 2
fi
prefix=${1:-/usr/local}
case $prefix in
  /*) ;;
  *) prefix=$(pwd)/$prefix ;;
esac
if [ -z "$from" ]; then
  echo "building vkernel (cargo install --locked --profile production --no-default-features --path crates/vkernel-cli --root $prefix)..."
  cargo install --locked --profile production --no-default-features --path "$root/crates/vkernel-cli" --root "$prefix"
else
  install -d "$prefix/bin"
  install -m 755 "$from" "$prefix/bin/vkernel"
fi
bin=$prefix/bin/vkernel
share=$prefix/share
install -d "$share/man/man1" "$share/bash-completion/completions" \
  "$share/zsh/site-functions" "$share/fish/vendor_completions.d" \
  "$prefix/lib/systemd/system" "$share/vkernel"
"$bin" man --out "$share/man/man1"
"$bin" completions bash > "$share/bash-completion/completions/vkernel"
"$bin" completions zsh > "$share/zsh/site-functions/_vkernel"
"$bin" completions fish > "$share/fish/vendor_completions.d/vkernel.fish"
for u in "$root"/dist/systemd/*.service; do
  sed "s|/usr/local/bin/vkernel|$bin|g" "$u" > "$prefix/lib/systemd/system/$(basename "$u")"
done
install -m 644 "$root/dist/vkernel.toml" "$share/vkernel/vkernel.toml"
echo "installed $bin with manual pages, completions and systemd units under $prefix"
echo "next: install -D -m 644 $share/vkernel/vkernel.toml /etc/vkernel/vkernel.toml, edit it,"
echo "      vkernel check-config, systemctl daemon-reload, systemctl enable --now vkernel-host"
