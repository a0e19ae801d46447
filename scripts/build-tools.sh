#!/usr/bin/env bash
# Builds the local cluster's binaries into a cache outside the clone, so a
# fresh clone on the same machine reuses them and a version bump rebuilds them:
#   - from the pinned tools module scripts/tools/controlplane (keyed by its
#     go.mod/go.sum and the Go version): etcd, kube-apiserver,
#     kube-controller-manager, kube-scheduler, kubelet (and kubectl on demand),
#     stamped with the Kubernetes version so nodes report v1.36.3;
#   - containerd, its runc shim and ctr at $containerd_version, built from
#     containerd's own module (kubelet 1.36 prefers containerd 2; Debian ships 1.6).
# Prints the bin directory on stdout; progress goes to stderr.
#
#   scripts/build-tools.sh            # everything the local cluster runs
#   scripts/build-tools.sh kubectl    # only the names given (kubectl: for
#                                     # machines that lack one)
#
# Code generators are not built here: they are `tool` lines in go.mod and run
# with `go tool`, which caches them in the Go build cache.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${STRATA_CACHE:-$HOME/.cache/strata}
mod="$root/scripts/tools/controlplane"
containerd_version=v2.2.9

key=$(cat "$mod/go.mod" "$mod/go.sum" <(go version) | sha256sum | cut -c1-16)
bin="$cache/controlplane-$key/bin"

declare -A pkgs=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [containerd]=github.com/containerd/containerd/v2/cmd/containerd@$containerd_version
  [containerd-shim-runc-v2]=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version
  [ctr]=github.com/containerd/containerd/v2/cmd/ctr@$containerd_version
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet
  containerd containerd-shim-runc-v2 ctr)
for name in "${names[@]}"; do
  [ -n "${pkgs[$name]:-}" ] || { echo "unknown tool: $name (known: ${!pkgs[*]})" >&2; exit 2; }
done

# The Kubernetes module's own version, so `kubectl get nodes` shows it.
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$mod/go.mod")
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
version_pkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $version_pkg.gitVersion=$k8s_version -X $version_pkg.gitMajor=1 -X $version_pkg.gitMinor=$k8s_minor"

# A containerd built at another version than the pinned one is rebuilt.
built() {
  [ -x "$bin/$1" ] || return 1
  case "${pkgs[$1]}" in
    *@*) [ "$(cat "$bin/$1.version" 2>/dev/null)" = "$containerd_version" ] ;;
  esac
}

missing=0
for name in "${names[@]}"; do built "$name" || missing=1; done

if [ "$missing" = 1 ]; then
  # One builder at a time: parallel test packages and `make run` may all ask.
  mkdir -p "$cache"
  exec 9>"$cache/controlplane-$key.lock"
  flock 9
  for name in "${names[@]}"; do
    built "$name" && continue
    echo "building $name (${pkgs[$name]}) into $bin; the first build takes several minutes" >&2
    start=$(date +%s)
    mkdir -p "$bin"
    case "${pkgs[$name]}" in
      *@*) # outside the tools module: containerd's own go.mod decides its dependencies
        tmp=$(mktemp -d "$bin/.gobin.XXXX")
        GOBIN="$tmp" go install -trimpath -ldflags='-s -w' -tags no_btrfs "${pkgs[$name]}"
        mv "$tmp/$name" "$bin/$name.tmp"; rm -rf "$tmp"
        echo "$containerd_version" >"$bin/$name.version" ;;
      *)
        (cd "$mod" && go build -trimpath -ldflags="$k8s_ldflags" -o "$bin/$name.tmp" "${pkgs[$name]}") ;;
    esac
    mv "$bin/$name.tmp" "$bin/$name"   # atomic: a half-written binary is never found
    echo "  $name built in $(( $(date +%s) - start ))s" >&2
  done
fi
echo "$bin"
