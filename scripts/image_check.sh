#!/usr/bin/env bash
# image_check.sh - builds the Dockerfile with podman and runs the image as a
# user would, checking what tests/deploy/test_image.py cannot without a
# container engine: the container turns healthy (its own HEALTHCHECK) on
# the port set by CANOPY_PORT alone and on the one set by --port alone,
# answers an inference, runs as uid 10001, and exits 0 when stopped (the
# drain). Opt-in, not part of `meson test`: it needs podman and, unless the
# base images exist, debootstrap and a Debian mirror to make them.
#
#   sudo apt-get install podman debootstrap      # Debian 12
#   scripts/image_check.sh                       # from the checkout
#
# Base images: the Dockerfile starts FROM debian:12 and debian:12-slim.
# When podman has no image of those names (no registry reachable, or none
# wanted), the script makes one with `debootstrap --variant=minbase
# bookworm` and `podman import`, and tags it as both (minbase is about
# what -slim holds).
# Environment:
#   PODMAN         the podman command and global options (default
#                  "podman"; e.g. "podman --storage-driver vfs
#                  --cgroup-manager cgroupfs --runtime runc" inside a
#                  container)
#   RUN_OPTS       more `podman run` options (e.g. "--ulimit host" where
#                  the container may not raise its own limits)
#   DEBIAN_MIRROR  for debootstrap (default http://deb.debian.org/debian)
#   IMAGE          the tag built (default localhost/canopy:check)
#   KEEP=1         keep the image afterwards
#   BUILD=0        check the image already tagged $IMAGE (kept by KEEP=1)
#                  instead of building it
# Exit 0: every check passed; the last line says so, with the build time
# and the image's size.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a podman <<< "${PODMAN:-podman}"
read -r -a run_opts <<< "${RUN_OPTS:-}"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
image=${IMAGE:-localhost/canopy:check}
say() { echo "image_check: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
for t in "${podman[0]}" curl python3; do
  command -v "$t" >/dev/null || fail "$t is not installed (see the header)"
done
tmp=$(mktemp -d)
names=()
cleanup() {
  for n in "${names[@]}"; do "${podman[@]}" rm -f "$n" >/dev/null 2>&1 || true; done
  [ "${KEEP:-0}" = 1 ] || "${podman[@]}" rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# 1. The base images.
if [ "${BUILD:-1}" = 0 ]; then
  say "BUILD=0: checking the existing $image"
elif ! "${podman[@]}" image exists debian:12 || \
   ! "${podman[@]}" image exists debian:12-slim; then
  command -v debootstrap >/dev/null || fail "no debian:12 image and no debootstrap"
  say "making debian:12 with debootstrap --variant=minbase bookworm ($mirror)"
  debootstrap --variant=minbase bookworm "$tmp/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -20 "$tmp/debootstrap.log" >&2; fail "debootstrap"; }
  # the .debs debootstrap leaves behind are no part of a base image
  rm -rf "$tmp"/rootfs/var/cache/apt/archives/*.deb "$tmp"/rootfs/var/lib/apt/lists/*
  tar -C "$tmp/rootfs" -c . | "${podman[@]}" import - debian:12 >/dev/null
  "${podman[@]}" tag debian:12 debian:12-slim
  rm -rf "$tmp/rootfs"
fi

# 2. The build, unchanged (docker format: OCI images drop HEALTHCHECK).
t0=$(date +%s)
if [ "${BUILD:-1}" != 0 ]; then
  say "building $image"
  "${podman[@]}" build --format docker --network host -t "$image" . >"$tmp/build.log" 2>&1 \
    || { tail -30 "$tmp/build.log" >&2; fail "podman build"; }
fi
build_s=$(( $(date +%s) - t0 ))
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# waits until the container's own HEALTHCHECK passes (60 s guard)
wait_healthy() {
  local n=$1 i
  for ((i = 0; i < 300; i++)); do
    [ "$("${podman[@]}" inspect --format '{{.State.Running}}' "$n")" = true ] \
      || { "${podman[@]}" logs "$n" >&2; fail "$n exited"; }
    if "${podman[@]}" healthcheck run "$n" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  "${podman[@]}" logs "$n" >&2
  fail "$n not healthy after 60 s"
}
run() {  # run NAME [podman run options] -- [canopy arguments]
  local n=$1; shift
  names+=("$n")
  "${podman[@]}" run -d --name "$n" --network host "${run_opts[@]}" "$@" >/dev/null
}

# 3. CANOPY_PORT alone.
p1=$(free_port)
run canopy-check-env -e CANOPY_PORT="$p1" "$image"
wait_healthy canopy-check-env
say "CANOPY_PORT=$p1 alone: healthy"
body='{"text": "The cat sat on the mat ."}'
out=$(curl -sf -d "$body" "http://127.0.0.1:$p1/v1/models/tagger/infer") \
  || fail "inference on $p1"
case $out in *'"tags"'*) ;; *) fail "inference answer: $out" ;; esac
say "inference: $out"
uid=$("${podman[@]}" exec canopy-check-env sh -c 'id -u; awk "/^Uid:/{print \$2}" /proc/1/status')
[ "$uid" = $'10001\n10001' ] || fail "uid: $uid (want 10001 for the shell and the daemon)"
say "uid 10001 (the daemon, PID 1, and a shell in the container)"

# 4. --port alone (arguments replace CMD).
p2=$(free_port)
run canopy-check-flag "$image" --port "$p2"
wait_healthy canopy-check-flag
curl -sf "http://127.0.0.1:$p2/v2/health/ready" >/dev/null || fail "ready on $p2"
say "--port $p2 alone: healthy"

# 5. Stop: SIGTERM drains, exit 0.
for n in canopy-check-env canopy-check-flag; do
  "${podman[@]}" stop -t 15 "$n" >/dev/null
  code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$n")
  [ "$code" = 0 ] || { "${podman[@]}" logs "$n" >&2; fail "$n exited $code after stop"; }
done
say "stop: both drained and exited 0"
echo "image_check: PASS (build ${build_s} s, image $((size / 1000000)) MB)"
