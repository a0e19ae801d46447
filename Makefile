# Strata: `make run` starts a local cluster with three nodes; `make test` runs
# every test (unit, integration, end-to-end). See README.md.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

.PHONY: build generate verify test test-long test-proof test-conformance tools fuzz run clean bench-backup bench-kbench host-packages deploy-manifest

build:
	$(GO) build -ldflags "-X github.com/strata-storage/strata/app.Version=$$(git describe --always --dirty 2>/dev/null || echo dev)" \
		-o $(BIN)/strata-manager .
	ln -f $(BIN)/strata-manager $(BIN)/kubectl-strata # the kubectl plugin: the same binary under its name
	$(GO) build -o $(BIN)/run-local ./scripts/run-local
	$(GO) build -o $(BIN)/test-times ./scripts/test-times

# Regenerate deepcopy, clientset, listers, informers and CRD YAML from
# k8s/pkg/apis, and the gRPC code from engineapi/proto.
generate:
	k8s/codegen.sh
	engineapi/generate.sh

# package/deploy/strata.yaml from the Helm chart package/chart/strata
# (default values; helm is built once into the tools cache), after copying
# the CRDs into the chart. Run it after changing the chart or the CRDs;
# make verify fails while they differ.
CHART = package/chart/strata
deploy-manifest:
	rm -f $(CHART)/crds/*.yaml $(CHART)/charts/snapshot-crds/crds/*.yaml
	cp k8s/crds/*.yaml $(CHART)/crds/
	cp "$$(scripts/build-tools.sh snapshot-crds)"/*.yaml $(CHART)/charts/snapshot-crds/crds/
	scripts/deploy-manifest.sh >package/deploy/strata.yaml.tmp
	mv package/deploy/strata.yaml.tmp package/deploy/strata.yaml

# Fails on generated-code drift, untidy go.mod, gofmt/vet findings, a
# non-zero informer resync, an oversized hand-written file, helm lint
# findings, or a package/deploy/strata.yaml the chart no longer renders.
verify:
	scripts/verify.sh

# The functional suite, what CI runs: unit tests (fake clientsets, fuzz
# seed corpora), integration and end-to-end tests (a real local control
# plane and kubelet nodes, real manager and instance-manager processes,
# qemu-io and nbdcopy). Every feature's end-to-end path runs at least once;
# the long modes (tests named TestLong*) are make test-long's, the proofs
# too long for CI (TestProof*) make test-proof's. The manager
# binary is built once and handed to every package that runs it. Prints
# failures as go test does, then the packages' and the 20 slowest tests'
# wall times (the raw events stay in bin/test.json; docs/testing.md).
# The three cluster packages are named first so that go test starts them
# first; -p 3 runs three packages at once on two cores, since the two
# cluster suites mostly wait (for Pods, attachments, kubelets): test/e2e
# and test/deployed side by side while the unit packages and
# test/dataplane go through the third slot.
test: host-packages build
	set -o pipefail; $(TEST_ENV) $(GO) test -p 3 -count=1 -timeout 30m -json -skip '^Test(Long|Proof)' \
		./test/e2e/ ./test/deployed/ ./test/dataplane/ ./... | \
		$(BIN)/test-times -save $(BIN)/test.json

# The long modes: the full replica model and crash lists, make run's double
# start, the local cluster's own checks, a real minute's cron tick; then
# every fuzz target for FUZZTIME (default 30s). docs/testing.md lists them.
LONG_PKGS = $(shell grep -rl --include='*_test.go' '^func TestLong' . | xargs -n1 dirname | sort -u)
test-long: host-packages build
	set -o pipefail; $(TEST_ENV) $(GO) test -count=1 -timeout 60m -json -run '^TestLong' $(LONG_PKGS) | \
		$(BIN)/test-times -save $(BIN)/test-long.json
	FUZZTIME=$${FUZZTIME:-30s} scripts/fuzz.sh

# The proofs at full size, too long for CI (about 30 minutes each here;
# docs/testing.md has their last runs).
test-proof: host-packages build
	set -o pipefail; $(TEST_ENV) $(GO) test -count=1 -timeout 120m -json -run '^TestProof' ./test/e2e/ | \
		$(BIN)/test-times -save $(BIN)/test-proof.json

# Kubernetes' own storage e2e suite, its External Storage tests (k8s.io/kubernetes
# v1.36.3), against Strata installed with the Helm chart on the local
# cluster's three kubelet nodes, with package/conformance/testdriver.yaml:
# every spec not [Disruptive], [Serial], [Slow] or behind an alpha/beta gate,
# plus the snapshot, xfs and volume group snapshot features. The e2e.test
# binary and ginkgo are built once into the tools cache (about 11 min cold);
# the report (JUnit, the suite's log, summary.md with counts per suite and
# pattern) goes to bin/conformance. STRATA_CONFORMANCE_PROCS (default 3),
# _FOCUS (a regex, default External.Storage) and _TIMEOUT (3h) tune the run.
# docs/conformance.md has the last run.
test-conformance: host-packages build
	STRATA_CONFORMANCE=1 $(TEST_ENV) $(GO) test -count=1 -timeout 300m -v -run '^TestExternalStorage$$' ./test/conformance/

TEST_ENV = STRATA_MANAGER_BIN=$(abspath $(BIN))/strata-manager

# Every tool make run needs (control plane, kubelet, containerd, the CSI
# sidecars, helm, versitygw), built in one go from scripts/tools/cluster
# into ~/.cache/strata (or found there); progress on stderr.
tools:
	@scripts/build-tools.sh run-tools >/dev/null

# Every fuzz target, time-boxed (override with FUZZTIME=10m).
fuzz:
	FUZZTIME=$${FUZZTIME:-2m} scripts/fuzz.sh

# exec, so Ctrl-C reaches run-local directly and make does not report it as a failure.
run: host-packages build tools
	@exec $(BIN)/run-local --manager-bin $(BIN)/strata-manager

# Backup and restore MiB/s through the instance manager to a local S3 server,
# against nbdcopy and raw S3 PUT/GET (about 2 minutes; docs/bench-backup.md).
bench-backup: build
	$(GO) run ./scripts/bench-backup -manager-bin $(BIN)/strata-manager

# The kbench-style suite through real Pods on the local cluster with the
# chart (about 10 minutes; docs/bench-kbench.md): fio on a hostPath
# directory, the raw NBD export and Strata claims, with ratios.
bench-kbench: build
	scripts/host-packages.sh bench
	$(GO) run ./scripts/bench-kbench -manager-bin $(BIN)/strata-manager

# The Debian packages the local cluster's nodes and the Strata image need
# (package/hostpackages/packages.txt): installed when run as root on Debian,
# otherwise the exact apt-get line to run.
host-packages:
	@scripts/host-packages.sh node image

clean:
	rm -rf $(BIN) .run
