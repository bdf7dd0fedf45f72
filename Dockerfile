# Canopy: build in a full Debian 12 stage, run in a slim one.
#   docker build -t canopy . && docker run --rm -p 8080:8080 canopy
#   docker run --rm -p 8080:8080 -v $PWD/models:/models:ro canopy
# Serves what is mounted at /models, else the demo models built here
# (deploy/image/entrypoint.sh). docs/deploy.md: the image in
# Kubernetes (deploy/k8s/) and KServe (deploy/kserve/).
# tests/deploy/test_image.py runs the build stage's commands against a
# scratch prefix (no Docker there); scripts/image_check.sh builds and runs
# the image for real with podman (opt-in).
FROM debian:12 AS build
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends build-essential meson ninja-build pkg-config \
      libjansson-dev libuv1-dev libhttp-parser-dev nettle-dev zlib1g-dev \
      libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN meson setup /build -Dtests=false -Dcuda=disabled -Dgrpc=enabled \
      --prefix /opt/canopy \
    && ninja -C /build && ninja -C /build install \
    && scripts/models.sh /build && cp -r models /opt/canopy/models \
    && install -m 755 deploy/image/entrypoint.sh /opt/canopy/bin/canopy-entrypoint \
    && install -m 755 deploy/image/healthcheck.sh /opt/canopy/bin/canopy-healthcheck

FROM debian:12-slim
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it; the
# policy cache (learned batching policies, written by the daemon) is the
# one directory it may write.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends libjansson4 libuv1 \
      libhttp-parser2.9 libnettle8 zlib1g libnghttp2-14 libprotobuf-c1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 canopy \
    && useradd --system --uid 10001 --gid 10001 --home /opt/canopy canopy \
    && mkdir -p /var/cache/canopy/policies /models \
    && chown -R 10001:10001 /var/cache/canopy
COPY --from=build /opt/canopy /opt/canopy
USER 10001:10001
WORKDIR /opt/canopy
# Address and port as daemon keys in the environment, not as CMD flags:
# `docker run canopy --workers 4` (arguments replace CMD) still listens
# on 0.0.0.0:8080, and `-e CANOPY_PORT=9000` or `canopy --port 9000`
# alone moves the daemon and its health check together (the check reads
# the port where the daemon does: its flags, then this environment).
ENV PATH=/opt/canopy/bin:$PATH \
    CANOPY_POLICY_CACHE=/var/cache/canopy/policies \
    CANOPY_HOST=0.0.0.0 \
    CANOPY_PORT=8080
# 8001: gRPC, where --grpc-port / CANOPY_GRPC_PORT opens it (off by
# default; the Kubernetes and KServe manifests set 8001)
EXPOSE 8080 8001
# Ready = models loaded and not draining. bash's /dev/tcp, no curl in the
# image (deploy/image/healthcheck.sh says why).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["canopy-healthcheck"]
# SIGTERM (docker stop) drains; give it more than drain-grace-ms:
# docker stop -t 15, or stop_grace_period in compose.
STOPSIGNAL SIGTERM
ENTRYPOINT ["canopy-entrypoint"]
CMD []
