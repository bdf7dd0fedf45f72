#!/usr/bin/env bash
# Installs the Debian 12 packages Canopy builds, runs and tests with.
# Skips apt-get entirely when everything is already installed.
# usage: scripts/deps.sh [--demo] [EXTRA_PACKAGE ...]
#   --demo: only what building and serving need (scripts/demo.sh)
set -euo pipefail
build_pkgs=(build-essential meson ninja-build pkg-config
            libjansson-dev libuv1-dev libhttp-parser-dev nettle-dev
            zlib1g-dev  # gzip/deflate bodies and answers (server/encoding.c)
            # the gRPC front end (server/grpc.c): HTTP/2, and the messages
            # generated from server/grpc_service.proto
            libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler)
if [ "${1:-}" = "--demo" ]; then
  shift
  pkgs=("${build_pkgs[@]}")
else
pkgs=("${build_pkgs[@]}"
      libopenblas0   # scripts/bench/run_bench.py: OpenBLAS sgemm, the peak it compares with
      libcriterion-dev python3 python3-numpy curl
      python3-grpcio python3-grpc-tools  # tests/python/test_grpc.py
      prometheus     # promtool; the deploy tests' Prometheus server
      nginx-light    # tests/deploy/test_nginx.py
      systemd        # systemd-analyze, tests/deploy/test_systemd.py
      python3-yaml   # tests/deploy/test_k8s.py
      nghttp2-client # h2load: scripts/bench/grpc_vs_http.py, gRPC (h2c) and HTTP/1.1 alike
      wrk            # scripts/bench/daemon.sh: the daemon under load
      python3-torch   # canopy_torch and canopy-import, and their tests
      # `pip install ./clients` into a venv, offline (tests/python/test_install.py)
      python3-venv python3-pip python3-setuptools python3-wheel)
fi
pkgs+=("$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
