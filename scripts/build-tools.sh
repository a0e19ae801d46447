#!/usr/bin/env bash
# Builds the local control plane's binaries (etcd, kube-apiserver,
# kube-controller-manager) from the pinned tools module scripts/tools/controlplane
# into a cache outside the clone, keyed by that module's content and the Go
# version, so a fresh clone on the same machine reuses them and a version bump
# rebuilds them. Prints the bin directory on stdout; progress goes to stderr.
#
#   scripts/build-tools.sh            # the three control plane binaries
#   scripts/build-tools.sh kubectl    # only the names given (kubectl: for
#                                     # machines that lack one)
#
# Code generators are not built here: they are `tool` lines in go.mod and run
# with `go tool`, which caches them in the Go build cache.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${STRATA_CACHE:-$HOME/.cache/strata}
mod="$root/scripts/tools/controlplane"

key=$(cat "$mod/go.mod" "$mod/go.sum" <(go version) | sha256sum | cut -c1-16)
bin="$cache/controlplane-$key/bin"

declare -A pkgs=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(etcd kube-apiserver kube-controller-manager)
for name in "${names[@]}"; do
  [ -n "${pkgs[$name]:-}" ] || { echo "unknown tool: $name (known: ${!pkgs[*]})" >&2; exit 2; }
done

missing=0
for name in "${names[@]}"; do [ -x "$bin/$name" ] || missing=1; done

if [ "$missing" = 1 ]; then
  # One builder at a time: parallel test packages and `make run` may all ask.
  mkdir -p "$cache"
  exec 9>"$cache/controlplane-$key.lock"
  flock 9
  for name in "${names[@]}"; do
    [ -x "$bin/$name" ] && continue
    echo "building $name (${pkgs[$name]}) into $bin; the first build takes several minutes" >&2
    start=$(date +%s)
    mkdir -p "$bin"
    (cd "$mod" && go build -trimpath -ldflags='-s -w' -o "$bin/$name.tmp" "${pkgs[$name]}")
    mv "$bin/$name.tmp" "$bin/$name"   # atomic: a half-written binary is never found
    echo "  $name built in $(( $(date +%s) - start ))s" >&2
  done
fi
echo "$bin"
