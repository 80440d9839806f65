# The base images are build arguments, so that a machine that reaches no
# registry can build from images of its own (scripts/local-build-images):
#   docker build --build-arg GO_IMAGE=... --build-arg RUNTIME_IMAGE=... .
ARG GO_IMAGE=golang:1.26
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# Build a static relay binary.
FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY . .
ARG VERSION=""
# Where modules come from: Go's defaults (the public proxy and checksum
# database) unless given, e.g. a proxy of your own.
ARG GOPROXY
ARG GOSUMDB
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/relay ./cmd/relay

# Run it from a minimal image, as an unprivileged user. The API listens on
# every interface of the container, so relay refuses to start without a
# bearer token to require (docker run -e RELAY_API_TOKEN=...). To serve
# without authentication, give the command yourself:
#   serve --addr 0.0.0.0:8080 --insecure-no-auth
FROM ${RUNTIME_IMAGE}
COPY --from=build /out/relay /usr/local/bin/relay
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/relay"]
CMD ["serve", "--addr", "0.0.0.0:8080"]
