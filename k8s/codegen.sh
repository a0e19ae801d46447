#!/usr/bin/env bash
# Regenerates everything derived from the API types in k8s/pkg/apis:
# deepcopy, the typed clientset (with fake), listers and informers
# (k8s.io/code-generator's kube_codegen.sh, at the version go.mod pins), and
# the CRD YAML in k8s/crds (controller-gen, a `tool` in go.mod).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
module=github.com/strata-storage/strata

codegen_version=$(go list -m -f '{{.Version}}' k8s.io/code-generator)
# kube_codegen.sh `go install`s its generators into GOBIN; keep them in the
# version-keyed cache rather than in GOPATH/bin.
export GOBIN="${STRATA_CACHE:-$HOME/.cache/strata}/codegen-$codegen_version/bin"
mkdir -p "$GOBIN"

# go list -m reports no directory for a module not yet in the module cache.
go mod download k8s.io/code-generator
# shellcheck source=/dev/null
source "$(go list -m -f '{{.Dir}}' k8s.io/code-generator)/kube_codegen.sh"

kube::codegen::gen_helpers \
  --boilerplate hack/boilerplate.go.txt \
  k8s/pkg/apis

# The generated client is replaced whole so a removed kind leaves nothing behind.
rm -rf k8s/pkg/client
kube::codegen::gen_client \
  --with-watch \
  --output-dir k8s/pkg/client \
  --output-pkg "$module/k8s/pkg/client" \
  --boilerplate hack/boilerplate.go.txt \
  k8s/pkg/apis 2> >(grep -v 'No such file or directory' >&2)

rm -rf k8s/crds
go tool controller-gen crd paths=./k8s/pkg/apis/... output:crd:dir=k8s/crds
# controller-gen gives every resource.Quantity a regular-expression pattern
# that no marker can remove; a user's `size: abc` should be refused with a
# sentence instead (internal/devtools/crdquantity).
go run ./scripts/crd-quantity k8s/crds/*.yaml
