# syntax=docker/dockerfile:1
#
# edgeplane's custom Caddy, built the way any third-party Caddy build is:
# xcaddy with this module. From the repository root:
#
#	docker build -f xcaddy.Dockerfile -t edgeplane/caddy .
#	docker run --network host -v edgeplane-data:/var/lib/edgeplane edgeplane/caddy
#
# The gateway listens on :8080 and :8443, the admin API on localhost:2019,
# and reads its projection from NATS at nats://127.0.0.1:4222 (see
# caddy.json; mount your own at /etc/caddy/caddy.json to change it).

ARG GO_VERSION=1.26.8
ARG CADDY_VERSION=v2.11.9
ARG XCADDY_VERSION=v0.4.7

FROM golang:${GO_VERSION}-bookworm AS build
ARG CADDY_VERSION
ARG XCADDY_VERSION
# Our module is not on the public proxy: without GOPRIVATE the proxy answers
# 400 for it and xcaddy's `go get` fails. GOVCS off for it keeps `go get`
# from trying git (and failing without github.com access): it falls back to
# the local replacement that --with sets.
ENV GOPRIVATE=github.com/edgeplane/* \
    GOVCS=github.com/edgeplane:off \
    GOFLAGS=-buildvcs=false \
    XCADDY_GO_BUILD_FLAGS="-trimpath -ldflags=-s -tags=nobadger,nomysql,nopgx"
# The proxy serves xcaddy by exact version only (not @latest).
RUN go install github.com/caddyserver/xcaddy/cmd/xcaddy@${XCADDY_VERSION}
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    xcaddy build ${CADDY_VERSION} --with github.com/edgeplane/edgeplane=/src --output /out/caddy \
 && /out/caddy list-modules | grep -q '^http.handlers.edgeplane$'

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/edgeplane/gateway /etc/caddy
COPY --from=build /out/caddy /usr/local/bin/caddy
COPY caddy.json /etc/caddy/caddy.json
ENV XDG_DATA_HOME=/var/lib/edgeplane XDG_CONFIG_HOME=/var/lib/edgeplane
VOLUME /var/lib/edgeplane
EXPOSE 8080 8443
ENTRYPOINT ["/usr/local/bin/caddy"]
CMD ["run", "--config", "/etc/caddy/caddy.json"]
