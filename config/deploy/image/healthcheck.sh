#!/bin/bash
# healthcheck.sh - the image's HEALTHCHECK: exit 0 when GET
# /v2/health/ready answers 200 (models loaded, not draining), else 1.
# bash's /dev/tcp instead of curl: the slim runtime image has bash (an
# Essential package) but no curl, and curl would add a dozen libraries to
# the image for one request. Port: $CANOPY_PORT, else 8080 (the CMD's).
set -u
port=${CANOPY_PORT:-8080}
{ exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || exit 1
printf 'GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
IFS= read -r -t 2 status <&3 || exit 1
[[ $status == "HTTP/1.1 200 "* ]]
