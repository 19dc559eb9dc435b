# syntax=docker/dockerfile:1
#
# mcp-gateway container images.
#
#   docker build -t mcp-gateway .                      # the gateway alone (default target)
#   docker build -t mcp-gateway:full --target full .   # plus Node.js (npx) and uv (uvx)
#
# Both run as an unprivileged user, listen on 8080 (MCP) and 9090 (admin: /healthz, /readyz,
# /metrics), read their config from /etc/mcp-gateway/gateway.toml (mount it; every setting
# can also come from MCP_GATEWAY_* environment variables) and keep their SQLite file, if no
# PostgreSQL URL is given, under /var/lib/mcp-gateway.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm
ARG NODE_VERSION=22
ARG UV_VERSION=0.9

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
# jemalloc's build needs make.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin mcp-gateway \
    && install -m 0755 target/release/mcp-gateway /usr/local/bin/mcp-gateway

FROM debian:${DEBIAN_RELEASE}-slim AS base
# tini is PID 1: it forwards SIGTERM to the gateway and reaps any orphan a plugin leaves.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 mcp \
    && useradd --system --uid 10001 --gid mcp --home-dir /var/lib/mcp-gateway --create-home \
       --shell /usr/sbin/nologin mcp \
    && mkdir -p /etc/mcp-gateway
COPY --from=build /usr/local/bin/mcp-gateway /usr/local/bin/mcp-gateway
ENV MCP_GATEWAY_LISTEN=0.0.0.0:8080 \
    MCP_GATEWAY_ADMIN_LISTEN=0.0.0.0:9090 \
    MCP_GATEWAY_DATABASE_URL=sqlite:///var/lib/mcp-gateway/mcp-gateway.db?mode=rwc \
    MCP_GATEWAY_LOG_FORMAT=json \
    HOME=/var/lib/mcp-gateway
WORKDIR /var/lib/mcp-gateway
EXPOSE 8080 9090
USER 10001:10001
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["mcp-gateway", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "mcp-gateway"]
CMD ["--config", "/etc/mcp-gateway/gateway.toml"]

# The gateway with Node.js (npx) and uv (uvx), so plugins from npm and PyPI run inside the
# container. Packages are fetched when a plugin first starts, into that plugin's cache in the
# plugin sandbox's directory (`[sandbox] dir`; the deployment files put it in the home
# directory, /var/lib/mcp-gateway: give that a writable volume when the root file system is
# read-only). Plugins get a clean environment with their own cache variables, not the ones
# below, which serve npx and uvx run by hand in the container (docker exec).
FROM node:${NODE_VERSION}-${DEBIAN_RELEASE}-slim AS node
FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM base AS full
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
    && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx
COPY --from=uv /uv /uvx /usr/local/bin/
ENV npm_config_cache=/var/lib/mcp-gateway/.npm \
    npm_config_update_notifier=false \
    UV_CACHE_DIR=/var/lib/mcp-gateway/.cache/uv \
    UV_PYTHON_PREFERENCE=only-system
USER 10001:10001

# The default target: the gateway alone.
FROM base AS runtime
