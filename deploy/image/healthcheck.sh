#!/bin/bash
# healthcheck.sh - the image's HEALTHCHECK: exit 0 when GET
# /v2/health/ready answers 200 (models loaded, not draining), else 1.
# bash's /dev/tcp instead of curl: the slim runtime image has bash (an
# Essential package) but no curl, and curl would add a dozen libraries to
# the image for one request.
#
# The port is the one the daemon was given, read where the daemon reads
# it and in its order (flags > environment > config file > 8080), so
# `docker run canopy --port 9000` and `docker run -e CANOPY_PORT=9000
# canopy` are both probed on 9000:
#   1. the daemon's own command line (--port N or --port=N): the daemon
#      is PID 1 (the entrypoint execs it) or, under an init such as
#      `docker run --init`, a child of PID 1;
#   2. $CANOPY_PORT (the container's environment, which the daemon
#      inherited);
#   3. a `port` line of the config file (--config or $CANOPY_CONFIG);
#   4. 8080, the daemon's default.
# CANOPY_HEALTHCHECK_PID names another process to read instead of PID 1
# (tests/deploy/test_image.py runs this outside a container).
set -u
daemon_args() {  # prints the daemon's argv, one per line; 1 if not found
  local pid=$1 c argv
  for c in "$pid" $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
    mapfile -d '' argv 2>/dev/null < /proc/"$c"/cmdline || continue
    if [ "${#argv[@]}" -ge 2 ] && [ "${argv[0]##*/}" = canopy ] &&
       [ "${argv[1]}" = serve ]; then
      printf '%s\n' "${argv[@]}"
      return 0
    fi
  done
  return 1
}
port= config=${CANOPY_CONFIG:-}
if args=$(daemon_args "${CANOPY_HEALTHCHECK_PID:-1}"); then
  mapfile -t argv <<< "$args"
  for ((i = 2; i < ${#argv[@]}; i++)); do
    case ${argv[i]} in
      --port) port=${argv[i + 1]:-} ;;
      --port=*) port=${argv[i]#--port=} ;;
      --config) config=${argv[i + 1]:-} ;;
      --config=*) config=${argv[i]#--config=} ;;
    esac
  done
fi
if [ -z "$port" ]; then port=${CANOPY_PORT:-}; fi
if [ -z "$port" ] && [ -n "$config" ] && [ -r "$config" ]; then
  port=$(sed -n 's/^[[:space:]]*port[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' \
           "$config" | tail -n 1)
fi
port=${port:-8080}
{ exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || exit 1
printf 'GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
IFS= read -r -t 2 status <&3 || exit 1
[[ $status == "HTTP/1.1 200 "* ]]
