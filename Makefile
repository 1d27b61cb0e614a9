# caw-box: every target a newcomer or CI needs. The Docker rig (scripts/rig.sh) starts a
# daemon when none answers and stops the one it started when the target ends.

CARGO        ?= cargo
RIG          := scripts/rig.sh
LOCAL_BASE   := caw-box-local/node:20-bookworm
CA_BUNDLE    ?= /etc/ssl/certs/ca-certificates.crt
BIN          := target/debug/caw-box
CA_FLAG      := $(if $(wildcard $(CA_BUNDLE)),--ca-cert $(CA_BUNDLE),)

.PHONY: deps build test test-unit test-e2e images stub-image demo bench bench-cluster dist drift soak fuzz lint clean help

help:
	@echo "make demo    run a session and resume it (stub model, no vendor account needed)"
	@echo "make test    lint + every test (starts Docker, builds images as needed)"
	@echo "make images  build the base and the four provider images"
	@echo "make bench   benchmarks against plain docker run and a plain pod (takes the k8s-lab)"
	@echo "make bench-cluster  a turn on ../shared/k8s-lab against a plain pod (takes the lab)"
	@echo "make dist    what a release publishes, into dist/: static musl binary, archive, wheel, SHA256SUMS"
	@echo "make drift   the newest vendor CLIs against the core e2e checks (table + target/drift.json)"
	@echo "make soak    killed drivers and a daemon restart under N detached turns: none lost (restarts dockerd)"
	@echo "make fuzz    property tests of every parser of untrusted input, 10^6 inputs each"
	@echo "make lint    rustfmt --check, clippy -D warnings (no function over 100 lines), workflows, layers, seam words, no import cycle between files, no file over 700 lines, cargo deny"
	@echo "make clean   remove build output and every caw-box test object"

deps:
	@$(RIG) build-deps

build: deps
	$(CARGO) build --workspace --all-targets

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	scripts/lint-workflows.sh
	scripts/lint-architecture.sh
	scripts/deny.sh
	node --test tests/proxy/

# Everything a test run needs, inside one rig session so a daemon the rig starts is
# stopped again at the end, pass or fail.
test: deps
	$(RIG) with scripts/test.sh

test-unit:
	$(CARGO) nextest run --workspace --lib --bins

images: build
	$(RIG) with scripts/images.sh

demo: build
	$(RIG) with scripts/demo.sh

bench: build
	$(RIG) with scripts/bench.sh

# The cluster part of `bench` alone: it takes the machine's one k8s-lab (down, up, and down
# when it ends; a test run's lab, named by CAW_BOX_K8S_LAB_RUN, is used as it is).
bench-cluster: build
	$(RIG) with scripts/bench.sh --only cluster

# What a release publishes (release.yml runs the same script): the static x86_64 musl
# binary, its archive with man pages and completions, the Python wheel, SHA256SUMS. No Docker.
dist: deps
	scripts/dist.sh

# Not part of `test` (its `--plan` is): the newest CLI releases, built as caw-box-drift/*
# images. DRIFT_ARGS="--provider claude_code" checks one provider.
DRIFT_ARGS   ?=
drift: build
	$(RIG) with scripts/drift.sh $(DRIFT_ARGS)
# Not part of `test`: it restarts the Docker daemon the rig started under every turn it
# runs (tests/e2e/soak.rs). SOAK_SESSIONS=N sessions (default 16).
SOAK_SESSIONS ?= 16
soak: build
	$(RIG) with scripts/soak.sh $(SOAK_SESSIONS)
# No Docker: the parsers are pure. About 10 minutes on 2 cores.
fuzz:
	scripts/fuzz.sh

clean:
	-scripts/cleanup.sh
	$(CARGO) clean
