# Tether — every habit has a target. See README.md.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/.bin
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION := v1.21.1
DATA_DIR ?= ./tether-data
LISTEN ?= 127.0.0.1:7420

PYTHON ?= python3
PYSDK := agentsdk/python

.PHONY: run test test-ts ts-deps test-py test-short test-cluster test-e2e-etcd test-crash bench bench-million demo demo-mcp generate check-generate lint tools build clean fuzz

build:
	$(GO) build -buildvcs=auto -o $(BIN)/tether ./cmd/tether

run: build
	$(BIN)/tether serve --data-dir $(DATA_DIR) --listen $(LISTEN)

# The race detector is on for every package: most of them run goroutines
# (the committer, streams, reconcilers) and the pure ones are cheap.
# On failure it ends with what failed, from the log: a package that timed
# out prints the tests it was running at the top of a long goroutine dump,
# which a CI page showing the output's tail does not show.
#
# The controlplane package's tests run one after another and take about
# twenty minutes under the race detector, mostly waiting on a core; they
# run as two processes side by side (the hostile-agent tests, TestRogue...,
# and the others: every test once), beside the other packages; their output
# follows the others'.
TEST_LOG ?= $(BIN)/test.log
test:
	$(GO) vet ./...
	@mkdir -p $(dir $(TEST_LOG)); set -o pipefail; \
	( $(GO) test -race -count=1 -timeout 35m -run '^TestRogue' ./controlplane > $(TEST_LOG).rogue 2>&1; echo $$? > $(TEST_LOG).rogue.rc ) & \
	( $(GO) test -race -count=1 -timeout 35m -skip '^TestRogue' ./controlplane > $(TEST_LOG).rest 2>&1; echo $$? > $(TEST_LOG).rest.rc ) & \
	$(GO) test -race -count=1 -timeout 35m $$($(GO) list ./... | grep -v '/controlplane$$') 2>&1 | tee $(TEST_LOG); status=$$?; \
	wait; \
	for part in rest rogue; do \
	  echo "== controlplane ($$part):" | tee -a $(TEST_LOG); tee -a $(TEST_LOG) < $(TEST_LOG).$$part; \
	  [ "$$(cat $(TEST_LOG).$$part.rc)" = 0 ] || status=1; \
	done; \
	if [ $$status -ne 0 ]; then \
	  echo "== what failed (the whole output is in $(TEST_LOG)):"; \
	  grep -E -A4 '^(--- FAIL|panic: test timed out|FAIL)|running tests:' $(TEST_LOG) | grep -v '^goroutine ' | head -80; \
	fi; exit $$status

# The etcd store (conformance and etcd-specific tests), the election, the
# leader-only components, the lease coordinator's takeover and the replica
# tests (forwarding; the leader killed during a termination and a renew
# storm) against a three-member etcd cluster (make test runs them against
# one member).
test-cluster:
	TETHER_REQUIRE_ETCD=1 TETHER_ETCD_MEMBERS=3 $(GO) test -race -count=1 -run 'Etcd|LeaderOnly' ./internal/store/... ./controlplane/leader/... ./controlplane/ ./supervisor/lease/coordinator/

# The end-to-end suites (real servers through controlplane/testserver) on an
# etcd store instead of Badger. The controlplane package alone takes longer
# under -race than go test's default 10-minute timeout (15 min on Badger on
# a 2-core machine, more on etcd), as in make test.
test-e2e-etcd:
	TETHER_REQUIRE_ETCD=1 TETHER_TEST_STORE=etcd $(GO) test -race -count=1 -timeout 60m ./controlplane/ ./agentsdk/ ./cmd/tether/

# The crash harness (internal/crash): the real binary, a mixed workload,
# kill -9 at seeded random points, every promise checked after each restart
# and the lease history checked linearizable. `make test` runs it with 3
# kills; TETHER_CRASH_SEED=<n> replays a run's workload and kill points.
CRASH_KILLS ?= 50
test-crash:
	TETHER_CRASH_KILLS=$(CRASH_KILLS) $(GO) test -count=1 -v -timeout 90m -run '^TestCrash$$' ./internal/crash/

# Every fuzz target in the module, FUZZTIME each (the seed corpora under
# testdata/fuzz run in `make test` too). Targets are found in the sources,
# so a new Fuzz* function is fuzzed without editing this file.
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# fail a target with a bare "context deadline exceeded" when the time runs
# out while a worker is busy (go.dev/issue/75804, fixed in Go 1.27); a
# count has no deadline to race. 50000 executions take 3–20 s per target.
FUZZTIME ?= 50000x
fuzz:
	@set -eo pipefail; \
	for file in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
	  dir=$$(dirname $$file); \
	  for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
	    echo "== $$fn in $$dir for $(FUZZTIME)"; \
	    $(GO) test -run='^$$' -fuzz="^$$fn$$" -fuzztime=$(FUZZTIME) $$dir; \
	  done; \
	done

bench:
	$(GO) run ./cmd/tether-bench -out bench-results.json

# The 1,000,000-agent figures (memory per agent, revoke to verifier reject,
# terminating the whole swarm on Badger; the same at 100,000 agents on
# etcd): tens of minutes and a few GiB of disk.
bench-million:
	$(GO) run ./cmd/tether-bench -million -run '^million/' -out bench-million.json

demo: build
	$(BIN)/tether demo $(DEMO_FLAGS)

demo-mcp: build
	$(BIN)/tether demo --mcp $(DEMO_FLAGS)

tools:
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)

# The TypeScript SDK's stubs come from protoc-gen-es in its node_modules,
# pinned by agentsdk/typescript/package-lock.json (npm ci, from the cache
# when it has the packages).
TS_DIR := agentsdk/typescript
GENERATED := proto/ $(TS_DIR)/src/gen/ controlplane/wire/conv.gen.go

ts-deps:
	cd $(TS_DIR) && npm ci --prefer-offline --no-audit --no-fund

generate: tools ts-deps
	PATH=$(BIN):$$PATH $(BIN)/buf generate
	$(BIN)/buf generate --template buf.gen.ts.yaml
	$(GO) generate ./controlplane/wire

check-generate: generate
	@git diff --exit-code -- $(GENERATED) || (echo "generated code is stale: run 'make generate' and commit" >&2; exit 1)
	@test -z "$$(git status --porcelain -- $(GENERATED))" || (git status --porcelain -- $(GENERATED); echo "generated code is stale: run 'make generate' and commit" >&2; exit 1)

# The TypeScript SDK: npm ci, tsc, and node's test runner against the
# tether binary built here (the tests start their own servers).
test-ts: build ts-deps
	cd $(TS_DIR) && npm run build && TETHER_BIN=$(BIN)/tether npm test

lint: tools
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(BIN)/buf lint

clean:
	rm -rf $(BIN) bench-results.json bench-million.json

# The Python SDK (agentsdk/python) against the tether binary built here:
# first the core in a venv with nothing but pytest (the core must import
# only the standard library), then everything with the pinned extras
# (cryptography, openai-agents, langgraph), where a missing extra fails
# instead of skipping.
test-py: build
	rm -rf $(PYSDK)/.venv-bare
	$(PYTHON) -m venv $(PYSDK)/.venv-bare
	$(PYSDK)/.venv-bare/bin/pip install -q --disable-pip-version-check -c $(PYSDK)/constraints.txt pytest
	cd $(PYSDK) && TETHER_BIN=$(BIN)/tether .venv-bare/bin/python -m pytest -q -p no:cacheprovider
	test -x $(PYSDK)/.venv/bin/python || $(PYTHON) -m venv $(PYSDK)/.venv
	$(PYSDK)/.venv/bin/pip install -q --disable-pip-version-check -c $(PYSDK)/constraints.txt -e '$(PYSDK)[crypto,openai-agents,langgraph,test]'
	cd $(PYSDK) && TETHER_BIN=$(BIN)/tether TETHER_REQUIRE_EXTRAS=1 .venv/bin/python -m pytest -q -p no:cacheprovider
