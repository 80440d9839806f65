# Relay's interface for humans and CI alike.
#
# Tests need a PostgreSQL server: RELAY_TEST_DATABASE_URL, or Docker for
# testcontainers (make test-containers). The default below is the local
# server this project's machines run; override it as needed.

RELAY_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export RELAY_TEST_DATABASE_URL

GO ?= go
SQLC := $(GO) tool -modfile=tools.mod sqlc

.PHONY: all generate check fmt-check vet sqlc-diff sqlc-vet test test-jsonv2 test-containers test-containers-path docker-context-check drop-test-databases modelcheck build run experiment chaos lint-actions clean

all: check

## generate: regenerate db/ from queries/ and migrations/
generate:
	$(SQLC) generate

## check: everything CI checks (format, vet, generated code, tests, the JSON packages under Go's next encoding/json)
check: fmt-check vet sqlc-diff sqlc-vet test test-jsonv2

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# The lab (experiment/) is a module of its own, and so is its River
# adapter (experiment/river/), the only module that requires River: every
# Go target runs in all three.
LAB := experiment
RIVER := experiment/river

vet:
	$(GO) vet ./...
	cd $(LAB) && $(GO) vet ./...
	cd $(RIVER) && $(GO) vet ./...

sqlc-diff:
	$(SQLC) diff

## sqlc-vet: sqlc's checks, including PREPARE of every query, against a freshly migrated database
sqlc-vet:
	RELAY_SQLC_DATABASE_URL="$$($(GO) run ./internal/dbtest/cmd/migrateddb)" $(SQLC) vet

## test: the whole test suite, with the race detector, against real PostgreSQL
test:
	$(GO) test -race -count=1 ./...
	cd $(LAB) && $(GO) test -race -count=1 ./...
	cd $(RIVER) && $(GO) test -race -count=1 ./...

## test-jsonv2: the packages that decode the API's and the built-in jobs' JSON, built with GOEXPERIMENT=jsonv2, under which encoding/json runs on Go's next JSON implementation: its errors and its corner cases differ
JSONV2_PACKAGES := ./server/... ./internal/jsonb/... ./internal/builtin/...
test-jsonv2:
	GOEXPERIMENT=jsonv2 $(GO) vet ./...
	GOEXPERIMENT=jsonv2 $(GO) test -count=1 $(JSONV2_PACKAGES)

## test-containers: the whole test suite, with the race detector, on PostgreSQL in containers (RELAY_TEST_POSTGRES_IMAGE, default postgres:15-alpine) started by testcontainers-go, with the tests that need Docker (needs a Docker engine)
test-containers:
	RELAY_TEST_DATABASE_URL= $(GO) test -race -count=1 ./...
	cd $(LAB) && RELAY_TEST_DATABASE_URL= $(GO) test -race -count=1 ./...

## test-containers-path: the migrations' and the API's tests, with the race detector, on PostgreSQL in a container started by testcontainers-go: what CI runs of test-containers, as the path is the same for every test (needs a Docker engine)
CONTAINERS_PATH_PACKAGES := ./migrations ./server
test-containers-path:
	RELAY_TEST_DATABASE_URL= $(GO) test -race -count=1 $(CONTAINERS_PATH_PACKAGES)

## docker-context-check: without Docker, the image's build stage builds relay from the build context (.dockerignore honoured), and the command lines of the Dockerfile and docker-compose.yml are relay's (part of test)
docker-context-check:
	$(GO) test -race -count=1 ./internal/dockerbuild
	$(GO) test -race -count=1 -run '^TestDocker' ./cmd/relay

## drop-test-databases: drop the databases that tests keep or leave on RELAY_TEST_DATABASE_URL's server (run it while no tests use that server)
# make check keeps relay_template_* and relay_sqlc_vet_* for the next run;
# an interrupted run leaves relay_test_* and relay_empty_*.
drop-test-databases:
	psql "$(RELAY_TEST_DATABASE_URL)" -Atc "SELECT format('DROP DATABASE %I;', datname) FROM pg_database WHERE datname ~ '^relay_(template|sqlc_vet|test|empty)_' ORDER BY datname" \
		| psql "$(RELAY_TEST_DATABASE_URL)" -q -e

## modelcheck: the model check of the state machine, seed after seed for RELAY_MODELCHECK_DURATION
RELAY_MODELCHECK_DURATION ?= 5m
modelcheck:
	RELAY_MODELCHECK_DURATION=$(RELAY_MODELCHECK_DURATION) $(GO) test -race -count=1 -v -timeout 0 -run 'TestModel$$|TestConcurrent$$' ./internal/modelcheck

## build: bin/relay; bin/relaylab, the lab's command that `relay experiment` runs; and bin/relaylab-river, the lab's River
build:
	$(GO) build -buildvcs=auto -o bin/relay ./cmd/relay
	cd $(LAB) && $(GO) build -buildvcs=auto -o ../bin/relaylab ./cmd/relaylab
	cd $(RIVER) && $(GO) build -o ../../bin/relaylab-river ./cmd/relaylab-river

## run: a running Relay with a throwaway database (or DATABASE_URL)
run:
	$(GO) run ./cmd/relay dev

## experiment: the crash and burst experiments, with default settings
experiment: build
	./bin/relay experiment crash
	./bin/relay experiment burst

## chaos: the full fault-injection programme
chaos: build
	./bin/relay experiment chaos

lint-actions:
	$(GO) run github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

clean:
	rm -rf bin
