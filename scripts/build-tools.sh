#!/usr/bin/env bash
# Builds the local cluster's binaries into a cache outside the clone, so a
# fresh clone on the same machine reuses them and a version bump rebuilds them.
# Everything comes from one pinned tools module, scripts/tools/cluster (the
# cache directory is keyed by its go.mod/go.sum and the Go version), so the
# libraries they share (client-go and the other Kubernetes libraries, grpc,
# protobuf, otel, golang.org/x/...) are one version each and compile once:
#   - etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
#     (and kubectl on demand), stamped with the Kubernetes version so nodes
#     report v1.36.3;
#   - containerd, its runc shim and ctr (kubelet 1.36 needs containerd 2;
#     Debian ships 1.6);
#   - on demand only, by name: versitygw (an S3-compatible server on a local
#     directory, for backups), helm (installs, renders and lints
#     package/chart/strata), and the upstream CSI sidecars csi-provisioner,
#     csi-attacher, csi-resizer, csi-snapshotter, snapshot-controller and
#     csi-snapshot-metadata.
# Names given together build in one `go build` (the sidecars then linked
# one by one, each with its own version stamp), so the go command spreads
# their packages and links over both cores: `make run` asks for all it
# needs at once (scripts/build-tools.sh run-tools).
# Prints the bin directory on stdout; progress goes to stderr.
#
#   scripts/build-tools.sh            # the control plane, kubelet, containerd
#   scripts/build-tools.sh run-tools  # everything make run needs
#   scripts/build-tools.sh kubectl    # only the names given (kubectl: for
#                                     # machines that lack one)
#   scripts/build-tools.sh helm       # make verify and package/deploy's test
#   scripts/build-tools.sh csi-provisioner csi-attacher csi-resizer \
#     csi-snapshotter snapshot-controller csi-snapshot-metadata
#   scripts/build-tools.sh snapshot-crds
#                  # prints instead a directory with the v1 VolumeSnapshot,
#                  # VolumeSnapshotContent and VolumeSnapshotClass CRD YAMLs
#                  # (and their VolumeGroupSnapshot kin) of external-snapshotter's
#                  # client module, and external-snapshot-metadata's
#                  # SnapshotMetadataService CRD (asked for alone)
#   scripts/build-tools.sh conformance
#                  # Kubernetes' storage e2e suite: e2e.test (`go test -c
#                  # k8s.io/kubernetes/test/e2e`) and the ginkgo CLI that
#                  # runs it on parallel nodes, from a module of their own,
#                  # scripts/tools/conformance, with a cache directory keyed
#                  # by that module (asked for alone, also by name: e2e.test,
#                  # ginkgo); prints that bin directory
#
# Code generators are not built here: they are `tool` lines in go.mod and run
# with `go tool`, which caches them in the Go build cache.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${STRATA_CACHE:-$HOME/.cache/strata}
mod="$root/scripts/tools/cluster"
# required_in module: the version the tools module requires of it.
required_in() { awk -v m="$1" '$1 == m {print $2; exit}' "$mod/go.mod"; }
snapshotter=github.com/kubernetes-csi/external-snapshotter
snapshotter_version=$(required_in "$snapshotter/v8")
# The SnapshotMetadata sidecar and its CRD (changed-block tracking, KEP-3314).
metadata=github.com/kubernetes-csi/external-snapshot-metadata
metadata_version=$(required_in "$metadata")

key=$(cat "$mod/go.mod" "$mod/go.sum" <(go version) | sha256sum | cut -c1-16)
bin="$cache/tools-$key/bin"

declare -A pkgs=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [containerd]=github.com/containerd/containerd/v2/cmd/containerd
  [containerd-shim-runc-v2]=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  [ctr]=github.com/containerd/containerd/v2/cmd/ctr
  [versitygw]=github.com/versity/versitygw/cmd/versitygw
  [helm]=helm.sh/helm/v3/cmd/helm
)
# CSI sidecars: name -> module; the command is <module>/cmd/<name>. Each
# is linked on its own, stamped with its module's version (main.version,
# which --version prints); their packages compile once for all six.
declare -A sidecars=(
  [csi-provisioner]=github.com/kubernetes-csi/external-provisioner/v6
  [csi-attacher]=github.com/kubernetes-csi/external-attacher/v4
  [csi-resizer]=github.com/kubernetes-csi/external-resizer/v2
  [csi-snapshotter]=$snapshotter/v8
  [snapshot-controller]=$snapshotter/v8
  [csi-snapshot-metadata]=$metadata
)
for name in "${!sidecars[@]}"; do
  pkgs[$name]=${sidecars[$name]}/cmd/$name
done
# Version stamps the go command cannot derive, one set for every binary
# (an -X for a package a binary lacks is ignored): the Kubernetes version,
# so `kubectl get nodes` shows it; containerd's (else 2.2.9+unknown);
# helm's, whose lint and `.Capabilities.KubeVersion` also default to
# Kubernetes 1.20 without the k8sVersion ones; versitygw's.
k8s_version=$(required_in k8s.io/kubernetes)
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
helm_version=$(required_in helm.sh/helm/v3)
version_pkg=k8s.io/component-base/version
module_ldflags="-s -w -X $version_pkg.gitVersion=$k8s_version -X $version_pkg.gitMajor=1 -X $version_pkg.gitMinor=$k8s_minor
  -X github.com/containerd/containerd/v2/version.Version=$(required_in github.com/containerd/containerd/v2)
  -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor
  -X main.Version=$(required_in github.com/versity/versitygw)"
# One set of build flags for every build from the module: tags are part of
# every package's cache key, so the sidecars reuse what the control plane
# compiled only if they match. no_btrfs: containerd without btrfs headers.
module_flags=(-trimpath -tags no_btrfs)

temps=()   # removed on exit, built or not
trap 'rm -rf "${temps[@]}"' EXIT

cluster_tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet
  containerd containerd-shim-runc-v2 ctr)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${cluster_tools[@]}")
# run-tools: all make run builds (the chart's sidecars, helm, versitygw),
# asked for at once so they build together.
if [ "${names[*]}" = run-tools ]; then
  names=("${cluster_tools[@]}" csi-provisioner csi-attacher csi-resizer csi-snapshotter snapshot-controller
    csi-snapshot-metadata helm versitygw)
fi
if [ "${names[*]}" = snapshot-crds ]; then
  # Named by both versions: the directory once held only the snapshot.storage
  # CRDs, then those and the group ones.
  crds="$cache/snapshot-crds-$snapshotter_version-metadata-$metadata_version"
  if [ ! -d "$crds" ]; then
    mkdir -p "$cache"
    exec 9>"$cache/tools-$key.lock"
    flock 9
  fi
  if [ ! -d "$crds" ]; then
    json=$(cd / && go mod download -json "$snapshotter/client/v8@$snapshotter_version") ||
      { echo "$json" >&2; exit 1; }
    src=$(echo "$json" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    json=$(cd / && go mod download -json "$metadata/client@$metadata_version") ||
      { echo "$json" >&2; exit 1; }
    metadata_src=$(echo "$json" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    tmp=$(mktemp -d "$cache/.snapshot-crds.XXXX")
    temps+=("$tmp")
    # The snapshot.storage.k8s.io and groupsnapshot.storage.k8s.io CRDs
    # (the directory holds a kustomization too, which is not a manifest).
    for kind in volumesnapshots volumesnapshotcontents volumesnapshotclasses; do
      cp "$src/config/crd/snapshot.storage.k8s.io_$kind.yaml" "$tmp/"
      cp "$src/config/crd/groupsnapshot.storage.k8s.io_volumegroup${kind#volume}.yaml" "$tmp/"
    done
    # SnapshotMetadataService: where backup tools find the metadata sidecar.
    cp "$metadata_src/config/crd/cbt.storage.k8s.io_snapshotmetadataservices.yaml" "$tmp/"
    chmod 755 "$tmp"; chmod 644 "$tmp"/*.yaml
    mv "$tmp" "$crds"   # atomic: a half-filled directory is never found
    echo "snapshot CRDs copied into $crds" >&2
  fi
  echo "$crds"
  exit 0
fi
# The storage e2e suite (test/conformance, make test-conformance): its own
# module and cache key, so that its dependencies (the e2e framework's cloud
# provider SDKs and more) leave scripts/tools/cluster's go.mod and go.sum,
# and so every other tool's cache key, as they are. e2e.test is a test
# binary (`go test -c`); ginkgo, the CLI at the suite's ginkgo version,
# runs it on parallel nodes. Stamped with the Kubernetes version, which
# the suite logs and compares with the API server's. Cold on 2 cores
# (2026-12-08): about 11 minutes for e2e.test with an empty Go build
# cache, less once the control plane built the libraries they share.
if [ "${names[*]}" = conformance ]; then names=(e2e.test ginkgo); fi
declare -A conformance_pkgs=([e2e.test]=k8s.io/kubernetes/test/e2e [ginkgo]=github.com/onsi/ginkgo/v2/ginkgo)
conformance_names=0
for name in "${names[@]}"; do [ -z "${conformance_pkgs[$name]:-}" ] || conformance_names=$((conformance_names + 1)); done
if [ "$conformance_names" -gt 0 ]; then
  [ "$conformance_names" = ${#names[@]} ] ||
    { echo "e2e.test and ginkgo print their own directory (scripts/tools/conformance): ask for them alone" >&2; exit 2; }
  cmod="$root/scripts/tools/conformance"
  ckey=$(cat "$cmod/go.mod" "$cmod/go.sum" <(go version) | sha256sum | cut -c1-16)
  cbin="$cache/conformance-$ckey/bin"
  todo=()
  for name in "${names[@]}"; do [ -x "$cbin/$name" ] || todo+=("$name"); done
  if [ ${#todo[@]} -gt 0 ]; then
    mkdir -p "$cbin"
    exec 9>"$cache/conformance-$ckey.lock"
    flock 9
    ckv=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$cmod/go.mod")
    cldflags="-s -w -X k8s.io/component-base/version.gitVersion=$ckv -X k8s.io/component-base/version.gitMajor=1
      -X k8s.io/component-base/version.gitMinor=$(echo "$ckv" | cut -d. -f2)"
    for name in "${todo[@]}"; do
      [ ! -x "$cbin/$name" ] || continue   # built by another caller while this one waited
      start=$(date +%s)
      echo "building $name into $cbin (e2e.test: about 11 min cold on 2 cores; ginkgo: seconds)" >&2
      if [ "$name" = e2e.test ]; then
        (cd "$cmod" && go test -c "${module_flags[@]}" -ldflags="$cldflags" -o "$cbin/$name.tmp" "${conformance_pkgs[$name]}")
      else
        (cd "$cmod" && go build "${module_flags[@]}" -ldflags="-s -w" -o "$cbin/$name.tmp" "${conformance_pkgs[$name]}")
      fi
      mv "$cbin/$name.tmp" "$cbin/$name"   # atomic: a half-written binary is never found
      echo "  built in $(( $(date +%s) - start ))s" >&2
    done
  fi
  echo "$cbin"
  exit 0
fi
for name in "${names[@]}"; do
  [ "$name" != snapshot-crds ] || { echo "snapshot-crds prints its own directory: ask for it alone" >&2; exit 2; }
  [ -n "${pkgs[$name]:-}" ] || { echo "unknown tool: $name (known: ${!pkgs[*]} snapshot-crds)" >&2; exit 2; }
done

# The bin directory is named by the tools module's hash: a binary there
# was built at the pinned versions.
built() { [ -x "$bin/$1" ]; }

# cold_seconds: what each adds to a build with an empty Go build cache on
# this kind of machine (2 cores; measured 2026-12-07 building run-tools'
# names in its order: the control plane's five together took 280 s, then
# containerd's three 32 s, the six sidecars 31 s, helm 17 s, versitygw
# 49 s: 409 s in all), for the progress lines; a name built alone first
# takes longer (it compiles the libraries it shares). kubectl: estimated.
declare -A cold_seconds=(
  [etcd]=40 [kube-apiserver]=150 [kube-controller-manager]=50 [kube-scheduler]=15 [kubelet]=25 [kubectl]=30
  [containerd]=25 [containerd-shim-runc-v2]=4 [ctr]=3 [versitygw]=49 [helm]=17
  [csi-snapshot-metadata]=6 [csi-provisioner]=10 [csi-attacher]=3 [csi-resizer]=4
  [csi-snapshotter]=4 [snapshot-controller]=4
)

# out_name: the file `go build -o dir/` writes for a package (its last path
# element, or the one before a major-version suffix).
out_name() {
  local p=${pkgs[$1]} b
  b=$(basename "$p")
  [[ ! $b =~ ^v[0-9]+$ ]] || b=$(basename "$(dirname "$p")")
  echo "$b"
}


missing=0
for name in "${names[@]}"; do built "$name" || missing=1; done

if [ "$missing" = 1 ]; then
  # One builder at a time: parallel test packages and `make run` may all ask.
  mkdir -p "$cache" "$bin"
  exec 9>"$cache/tools-$key.lock"
  flock 9
  # Two kinds of step: the module's commands in one go build, then each
  # sidecar linked with its own version stamp.
  together=() linked=()
  total=0
  for name in "${names[@]}"; do
    built "$name" && continue
    if [ -n "${sidecars[$name]:-}" ]; then linked+=("$name")
    else together+=("$name"); fi
    total=$((total + ${cold_seconds[$name]:-120}))
  done
  todo=("${together[@]}" "${linked[@]}")
  steps=$(( (${#together[@]} > 0 ? 1 : 0) + ${#linked[@]} ))
  step=0
  # progress name...: the step's line, with the cold estimate of its names.
  progress() {
    local est=0 n
    for n in "$@"; do est=$((est + ${cold_seconds[$n]:-120})); done
    step=$((step + 1))
    echo "[$step/$steps] building $*; cold about $est s" >&2
  }
  [ ${#todo[@]} -eq 0 ] || echo "building ${#todo[@]} tools into $bin: ${todo[*]}; with an empty Go build cache about $((total / 60 + 1)) min on 2 cores, much less once it holds their libraries" >&2
  start=$(date +%s)
  if [ ${#together[@]} -gt 0 ]; then
    progress "${together[@]}"
    out=$(mktemp -d "$bin/.build.XXXX")
    temps+=("$out")
    list=()
    for name in "${together[@]}"; do list+=("${pkgs[$name]}"); done
    (cd "$mod" && go build "${module_flags[@]}" -ldflags="$module_ldflags" -o "$out/" "${list[@]}")
    for name in "${together[@]}"; do mv "$out/$(out_name "$name")" "$bin/$name"; done
    echo "  built in $(( $(date +%s) - start ))s" >&2
  fi
  for name in "${linked[@]}"; do
    progress "$name"
    start=$(date +%s)
    (cd "$mod" && go build "${module_flags[@]}" -ldflags="-s -w -X main.version=$(required_in "${sidecars[$name]}")" \
      -o "$bin/$name.tmp" "${pkgs[$name]}")
    mv "$bin/$name.tmp" "$bin/$name"   # atomic: a half-written binary is never found
    echo "  built in $(( $(date +%s) - start ))s" >&2
  done
fi
echo "$bin"
