# Strata: `make run` starts a local cluster with three nodes; `make test` runs
# every test (unit, integration, end-to-end). See README.md.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

.PHONY: build generate verify test fuzz run clean bench-backup

build:
	$(GO) build -ldflags "-X github.com/strata-storage/strata/app.Version=$$(git describe --always --dirty 2>/dev/null || echo dev)" \
		-o $(BIN)/strata-manager .
	$(GO) build -o $(BIN)/run-local ./scripts/run-local

# Regenerate deepcopy, clientset, listers, informers and CRD YAML from
# k8s/pkg/apis, and the gRPC code from engineapi/proto.
generate:
	k8s/codegen.sh
	engineapi/generate.sh

# Fails on generated-code drift, untidy go.mod, gofmt/vet findings, a
# non-zero informer resync, or an oversized hand-written file.
verify:
	scripts/verify.sh

# Every fuzz target briefly, then unit tests (fake clientsets) and
# integration/end-to-end tests (a real local control plane, real manager and
# instance-manager processes, qemu-io and nbdcopy). go test's summary comes last.
test:
	FUZZTIME=5s scripts/fuzz.sh
	$(GO) test -count=1 -timeout 40m ./...

# Every fuzz target for longer (override with FUZZTIME=10m).
fuzz:
	FUZZTIME=$${FUZZTIME:-2m} scripts/fuzz.sh

# exec, so Ctrl-C reaches run-local directly and make does not report it as a failure.
run: build
	@exec $(BIN)/run-local --manager-bin $(BIN)/strata-manager

# Backup and restore MiB/s through the instance manager to a local S3 server,
# against nbdcopy and raw S3 PUT/GET (about 2 minutes; docs/bench-backup.md).
bench-backup: build
	$(GO) run ./scripts/bench-backup -manager-bin $(BIN)/strata-manager

clean:
	rm -rf $(BIN) .run
