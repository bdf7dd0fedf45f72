# Canopy: build in a full Debian 12 stage, run in a slim one.
#   docker build -t canopy . && docker run --rm canopy
FROM debian:12 AS build
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends build-essential meson ninja-build pkg-config \
      libjansson-dev libopenblas-dev libuv1-dev libmicrohttpd-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN meson setup /build -Dtests=false -Dcuda=disabled --prefix /opt/canopy \
    && ninja -C /build && ninja -C /build install \
    && scripts/models.sh /build && cp -r models /opt/canopy/models

FROM debian:12-slim
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends libjansson4 libopenblas0-pthread libuv1 \
      libmicrohttpd12 libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /opt/canopy canopy
COPY --from=build /opt/canopy /opt/canopy
USER canopy
WORKDIR /opt/canopy
ENV PATH=/opt/canopy/bin:$PATH
EXPOSE 8080
CMD ["canopy", "serve", "--models-dir", "models", "--host", "0.0.0.0", "--port", "8080"]
