# pitlane: two commands for a newcomer.
#   make run   install what is missing, build, start `pitlane dev` (private PostgreSQL, console)
#   make test  install what the tests need, check generated code, vet, and run every test
#              against one throwaway PostgreSQL cluster
# .ci/run is `make test` and nothing else.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO      ?= go
BIN     := $(CURDIR)/.bin
PITLANE := $(CURDIR)/bin/pitlane
TESTPG  := $(BIN)/testpg

# What `make test` runs; narrow it for a quick loop: make test PKGS=./payments TESTFLAGS='-run TestX'
PKGS      ?= ./...
TESTFLAGS ?=

STRIPE_MOCK_VERSION := v0.203.0
# axe-core, the accessibility rules the checkout's Chromium tests run in the page: a test-only
# asset from the npm registry (never a browser download), installed into .bin/axe.
AXE_VERSION := 4.14.1

# Paths the tests read (exported to them by the test target). Override any of them to use
# a binary from elsewhere.
STRIPE_MOCK_BIN ?= $(BIN)/stripe-mock
CHROMIUM_BIN    ?= /usr/bin/chromium
PGBOUNCER_BIN   ?= /usr/sbin/pgbouncer
# promtool (Debian's prometheus package) checks and unit-tests deploy/prometheus's alert rules.
PROMTOOL_BIN    ?= /usr/bin/promtool
AXE_JS          ?= $(BIN)/axe/node_modules/axe-core/axe.min.js

# apt_install PACKAGES: as root install them (after one apt-get update), otherwise print the
# exact command and stop. An install that fails stops the build loudly.
define apt_install
	pkgs="$(strip $(1))"; \
	if [ -n "$$pkgs" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make: installing $$pkgs (apt-get)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq || { echo "make: apt-get update FAILED" >&2; exit 1; }; \
	    apt-get install -y -qq $$pkgs || { echo "make: apt-get install -y $$pkgs FAILED" >&2; exit 1; }; \
	  else \
	    echo "make: missing $$pkgs; install them with:" >&2; \
	    echo "    sudo apt-get update && sudo apt-get install -y $$pkgs" >&2; \
	    exit 1; \
	  fi; \
	fi
endef

# The same search as internal/pgrunner: initdb on PATH or in Debian's versioned directory.
HAVE_PG = command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1

.PHONY: help run test build deps deps-test generate check-generated vet bench bench-go polygon clean

help:
	@echo "make run       start pitlane dev (private PostgreSQL + console) after installing what is missing"
	@echo "make test      install test dependencies, check generated code, vet, run all tests on a throwaway cluster"
	@echo "make build     build bin/pitlane"
	@echo "make generate  regenerate templ code (commit the result)"
	@echo "make bench     every figure beside its anchor (internal/bench; BENCH_SCALE=small for a quick run)"

## deps: PostgreSQL server binaries (what `make run` needs).
deps:
	@missing=""; $(HAVE_PG) || missing="postgresql"; \
	$(call apt_install,$$missing)

## deps-test: everything the test suite drives for real.
deps-test:
	@missing=""; \
	$(HAVE_PG) || missing="$$missing postgresql"; \
	[ -x "$(CHROMIUM_BIN)" ] || missing="$$missing chromium"; \
	[ -x "$(PGBOUNCER_BIN)" ] || command -v pgbouncer >/dev/null 2>&1 || missing="$$missing pgbouncer"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	[ -x "$(PROMTOOL_BIN)" ] || command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	$(call apt_install,$$missing)
	@if ! grep -qs '"version": "$(AXE_VERSION)"' "$(BIN)/axe/node_modules/axe-core/package.json"; then \
	  echo "make: installing axe-core $(AXE_VERSION) into $(BIN)/axe (npm)"; \
	  mkdir -p "$(BIN)/axe" && npm install --prefix "$(BIN)/axe" --no-save --no-audit --no-fund --silent axe-core@$(AXE_VERSION) \
	    || { echo "make: npm install axe-core@$(AXE_VERSION) FAILED" >&2; exit 1; }; \
	fi
	@if [ ! -x "$(STRIPE_MOCK_BIN)" ]; then \
	  echo "make: installing stripe-mock $(STRIPE_MOCK_VERSION) into $(BIN)"; \
	  GOBIN="$(BIN)" $(GO) install github.com/stripe/stripe-mock@$(STRIPE_MOCK_VERSION) \
	    || { echo "make: go install github.com/stripe/stripe-mock@$(STRIPE_MOCK_VERSION) FAILED" >&2; exit 1; }; \
	fi

build:
	$(GO) build -o $(PITLANE) ./cmd/pitlane

run: deps build
	exec $(PITLANE) dev

generate:
	$(GO) tool templ generate -log-level warn

## check-generated: templ output must match the .templ sources as committed.
check-generated:
	@$(GO) tool templ generate -check -log-level warn \
	  || { echo "make: generated templ code is stale: run 'make generate' and commit the *_templ.go files" >&2; exit 1; }

## vet: go vet, then staticcheck (pinned as a go.mod tool: it finds dead code and deprecated
## calls that vet does not).
vet:
	@unformatted="$$($$($(GO) env GOROOT)/bin/gofmt -l $$($(GO) list -f '{{.Dir}}' ./...))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt: these files are not formatted:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

$(TESTPG): FORCE
	@$(GO) build -o $(TESTPG) ./internal/pgrunner/cmd/testpg

## test: one throwaway cluster for the whole run (testpg stops it even when tests fail and
## exits with the tests' status).
TESTENV = STRIPE_MOCK_BIN="$(STRIPE_MOCK_BIN)" CHROMIUM_BIN="$(CHROMIUM_BIN)" AXE_JS="$(AXE_JS)" \
	PGBOUNCER_BIN="$$( [ -x "$(PGBOUNCER_BIN)" ] && echo "$(PGBOUNCER_BIN)" || command -v pgbouncer )" \
	PROMTOOL_BIN="$$( [ -x "$(PROMTOOL_BIN)" ] && echo "$(PROMTOOL_BIN)" || command -v promtool )"

## The core's packages run a second time with pgx's exec mode, the one pgbouncer's transaction
## pooling wants (docs/operations.md): values pgx encodes otherwise there (a []byte goes as
## bytea, a []any cannot be encoded) broke the stats cache and the settle batch in production's
## setting while every test passed. EXEC_PKGS= skips it.
EXEC_PKGS ?= ./payments/ ./handlers/ ./web/ ./access/

test: deps-test check-generated vet $(TESTPG)
	$(TESTENV) $(TESTPG) -- $(GO) test -race -count=1 -timeout 20m $(TESTFLAGS) $(PKGS)
	[ -z "$(EXEC_PKGS)" ] || $(TESTENV) $(TESTPG) -- sh -c 'case "$$TEST_DATABASE_URL" in *\?*) sep="&";; *) sep="?";; esac; \
	  TEST_DATABASE_URL="$$TEST_DATABASE_URL$${sep}default_query_exec_mode=exec" exec $(GO) test -count=1 -timeout 15m $(TESTFLAGS) $(EXEC_PKGS)'

## bench: the benchmark program (internal/bench) at full size: every figure beside its anchor on
## its own private PostgreSQL, a table, and .pitlane/bench/report.json. Reports, never assertions.
## BENCH_SCALE=small for a quick run; `make test` runs it small once (TestBenchSmall).
## bench-go: the go test -bench lines of the packages, on a throwaway cluster.
bench: deps
	$(GO) run ./internal/bench

bench-go: deps $(TESTPG)
	$(TESTPG) -- $(GO) test -run '^$$' -bench . -benchmem $(TESTFLAGS) $(PKGS)

## polygon: the concurrency proving ground at full size (make test runs the same scenarios small):
## two sweepers over 10000 due sessions, a chaos run over 1000 orders, the finance workbench's
## query plans, the Operations page's and the events feed's and the flagged refunds' over a million sessions, then the benchmarks.
polygon: deps $(TESTPG)
	$(TESTPG) -- env PITLANE_SCALE=full $(GO) test -count=1 -timeout 60m -v -run 'Chaos|MessyDay|MessierDay|FourthDay|FifthDay|StaffDay|TwoSweepers|Pgbouncer|StuckQueriesUseIndexes|OpsChartQueriesUseIndexes|FeedReadsByItsIndex|FlaggedRefundsReadByTheirIndex' ./payments/ 2>&1 | grep -v testdbconf
	$(TESTPG) -- $(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf bin $(BIN)

FORCE:
