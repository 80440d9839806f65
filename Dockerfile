# syntax=docker/dockerfile:1

# Build a static relay binary.
FROM golang:1.26 AS build
WORKDIR /src
COPY . .
ARG VERSION=""
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
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/relay /usr/local/bin/relay
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/relay"]
CMD ["serve", "--addr", "0.0.0.0:8080"]
