#!/bin/sh
# The container deployment, tried for real with podman: builds the image
# of deploy/Containerfile (FROM scratch, the static binary only) and runs,
# each in its own container and so its own PID namespace,
#   vkhost   the machine host (the image's default command),
#   vkecho   an echo server attached to vkhost through a shared volume
#            holding the host's socket (the Kubernetes pod pattern),
#   client   `vkernel ping --peer vkhost:7000`, a remote client that finds
#            the host by its DNS name on the podman network;
# then stops vkecho, then vkhost, with SIGTERM (`podman stop`) and checks
# both exit 0 with their summaries, and that the socket is removed.
#
#   scripts/check-containers.sh
#
# Everything runs inside a network namespace this script creates, and
# the podman network (a TEST-NET-2 subnet) lives only there; both are
# removed at exit, with the containers and the image. Needs root, podman
# and, where crun cannot run containers (cgroup v1 hosts), runc.
# Without podman it says so and exits 0, unless VKERNEL_REQUIRE_PODMAN=1.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v podman >/dev/null 2>&1; then
  [ "${VKERNEL_REQUIRE_PODMAN:-}" != 1 ] || { echo "podman is required (VKERNEL_REQUIRE_PODMAN=1) but not installed"; exit 1; }
  echo "podman is not installed: skipped"; exit 0
fi
id=$$
tag=localhost/vkernel:check-$id
ns=vk-ctr-$id
net=vkctr$id
sock=$(mktemp -d)
cleanup() {
  for c in vkclient-$id vkecho-$id vkhost-$id; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  podman network rm -f "$net" >/dev/null 2>&1 || true
  podman rmi -f "$tag" >/dev/null 2>&1 || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$sock"
}
trap cleanup EXIT
fail() { echo "check-containers: $*"; for c in vkhost-$id vkecho-$id; do echo "--- $c"; podman logs "$c" 2>&1 | tail -20 || true; done; exit 1; }

sh "$root/scripts/build-image.sh" "$tag"

ip netns add "$ns"
ip -n "$ns" link set lo up
# nsenter (not `ip netns exec`, which remounts /sys without its cgroups):
# podman, its network and containers then live in the namespace.
p() { nsenter --net="/run/netns/$ns" podman ${runtime:+--runtime "$runtime"} "$@"; }
# Limits at or below this machine's (a runtime asking for more than the
# hard limit fails without CAP_SYS_RESOURCE).
lim="--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"
runtime=""
if ! p run --rm $lim --network none "$tag" --version >/dev/null 2>&1; then
  runtime=runc
  p run --rm $lim --network none "$tag" --version >/dev/null || fail "the image does not run with crun or runc"
fi
echo "container runtime: ${runtime:-the default of podman}"
p network create --subnet 198.51.100.0/24 "$net" >/dev/null
# The host runs as uid 10001 and makes its socket in the shared volume.
chown 10001:10001 "$sock"
run="$lim --network $net -v $sock:/run/vkernel"

wait_log() { # container, text
  i=0
  until p logs "$1" 2>&1 | grep -q "$2"; do
    i=$((i + 1)); [ $i -lt 200 ] || fail "$1 did not print \"$2\""
    sleep 0.05
  done
}

p run -d $run --name "vkhost-$id" "$tag" host --bind 0.0.0.0:7000 --metrics 0.0.0.0:9100 --exit-after 120s >/dev/null
wait_log "vkhost-$id" "programs attach at"
# --attach without a path: VKERNEL_HOST from the image.
p run -d $run --name "vkecho-$id" "$tag" echo --attach --exit-after 120s >/dev/null
wait_log "vkecho-$id" '"echo"'
p logs "vkhost-$id" 2>/dev/null | head -1
# The Kubernetes startup probe's command, run by name in the host's container.
p exec "vkhost-$id" vkernel stats --attach=/run/vkernel/host.sock --count=1 >/dev/null || fail "the startup probe's command failed"
p logs "vkecho-$id" 2>/dev/null | head -1

out=$(p run --rm $lim --network "$net" --name "vkclient-$id" "$tag" ping --peer "vkhost-$id:7000" -n 2000 2>/dev/null) || fail "ping failed: $out"
echo "$out"
echo "$out" | grep -q "failures 0" || fail "exchanges failed"

t0=$(date +%s%N)
# The attached echo first, as a deployment stops a host's dependents
# before the host: stopped together, the host could exit first and the
# echo would end with "the machine host has gone" (exit 1) before its
# own SIGTERM was handled.
p stop -t 10 "vkecho-$id" >/dev/null
p stop -t 10 "vkhost-$id" >/dev/null
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
for c in vkecho vkhost; do
  code=$(p inspect --format '{{.State.ExitCode}}' "$c-$id")
  [ "$code" = 0 ] || fail "$c exited $code after SIGTERM (137: it ignored SIGTERM and was killed)"
  p logs "$c-$id" 2>/dev/null | grep "exiting after" || fail "$c printed no summary"
done
p logs "vkecho-$id" 2>/dev/null | grep -q "[1-9][0-9]* requests answered" || fail "the echo answered nothing"
[ ! -e "$sock/host.sock" ] || fail "the host left its socket behind"
echo "SIGTERM stopped both in $ms ms, exit status 0"
echo "containers ok"
