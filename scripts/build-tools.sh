#!/usr/bin/env bash
# Builds the local cluster's binaries into a cache outside the clone, so a
# fresh clone on the same machine reuses them and a version bump rebuilds them:
#   - from the pinned tools module scripts/tools/controlplane (keyed by its
#     go.mod/go.sum and the Go version): etcd, kube-apiserver,
#     kube-controller-manager, kube-scheduler, kubelet (and kubectl on demand),
#     stamped with the Kubernetes version so nodes report v1.36.3;
#   - containerd, its runc shim and ctr at $containerd_version, built from
#     containerd's own module (kubelet 1.36 prefers containerd 2; Debian ships 1.6);
#   - on demand only, by name: versitygw (an S3-compatible server on a
#     local directory, for the backup tests; about 5-10 min cold), helm
#     (renders and lints package/chart/strata; 49 s here with the k8s.io
#     modules already in the Go build cache, a few minutes without), and the
#     upstream CSI sidecars: csi-provisioner, csi-attacher, csi-resizer,
#     csi-snapshotter, snapshot-controller and csi-snapshot-metadata, all
#     from the one pinned tools module scripts/tools/sidecars, so the
#     libraries they share compile once (its go.mod says which versions
#     their own modules asked for).
# Binaries built outside the tools module carry <name>.version beside them
# and are rebuilt when their pinned version changes.
# Prints the bin directory on stdout; progress goes to stderr.
#
#   scripts/build-tools.sh            # everything the local cluster runs
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
#
# Code generators are not built here: they are `tool` lines in go.mod and run
# with `go tool`, which caches them in the Go build cache.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${STRATA_CACHE:-$HOME/.cache/strata}
mod="$root/scripts/tools/controlplane"
containerd_version=v2.2.9
sidecar_mod="$root/scripts/tools/sidecars"
# required_in module: the version the sidecars tools module requires of it.
required_in() { awk -v m="$1" '$1 == m {print $2; exit}' "$sidecar_mod/go.mod"; }
snapshotter=github.com/kubernetes-csi/external-snapshotter
snapshotter_version=$(required_in "$snapshotter/v8")
# The SnapshotMetadata sidecar and its CRD (changed-block tracking, KEP-3314):
# built from its own module (see below).
metadata=github.com/kubernetes-csi/external-snapshot-metadata
metadata_version=v1.0.0
helm_version=v3.22.0

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
  # the S3-compatible server backups are tested against (on demand)
  [versitygw]=github.com/versity/versitygw/cmd/versitygw@v1.8.0
  # renders and lints the chart (on demand); its go.mod has no replaces
  [helm]=helm.sh/helm/v3/cmd/helm@$helm_version
)
# Version stamps go install cannot derive: helm reports v3.22 without the
# first, and its lint and `.Capabilities.KubeVersion` default to Kubernetes
# 1.20 without the others (the make target of helm sets them from its
# k8s.io modules, v0.37).
declare -A ldflags=(
  [helm]="-X helm.sh/helm/v3/internal/version.version=$helm_version
    -X helm.sh/helm/v3/internal/version.gitTreeState=clean
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37"
)
# CSI sidecars: name -> module and the command's directory in it; built in
# the sidecars tools module. The version stamp is the module's version
# there and the tools module's own hash, so a bump of either rebuilds them.
sidecar_key=$(cat "$sidecar_mod/go.mod" "$sidecar_mod/go.sum" | sha256sum | cut -c1-8)
declare -A sidecars=(
  [csi-provisioner]=github.com/kubernetes-csi/external-provisioner/v6
  [csi-attacher]=github.com/kubernetes-csi/external-attacher/v4
  [csi-resizer]=github.com/kubernetes-csi/external-resizer/v2
  [csi-snapshotter]=$snapshotter/v8
  [snapshot-controller]=$snapshotter/v8
)
# sidecar_version: what the sidecar's --version prints.
sidecar_version() { required_in "${sidecars[$1]}"; }
for name in "${!sidecars[@]}"; do
  pkgs[$name]=${sidecars[$name]}/cmd/$name@$(sidecar_version "$name")-$sidecar_key
done
# Sidecars whose versions do not agree with the tools module's, built from
# a copy of their own module: csi-snapshot-metadata v1.0.0 compiles
# csi-test v5.4.0's mock driver into the binary, which needs the CSI spec
# v1.12 and github.com/golang/mock, where the others need the spec v1.13
# (and csi-snapshotter's tests csi-test v5.6.0, on go.uber.org/mock).
# `go install pkg@version` refuses its replace directives, so the module is
# copied to a writable temp dir, its replaces to local paths dropped, and
# built there with -mod=mod.
declare -A own_module=(
  [csi-snapshot-metadata]=$metadata@$metadata_version
)
# Requirements that replace the dropped local replaces: it points client at
# ./client and names client@v0.2.0, which this machine's module proxy
# refuses (its v1.0.0 is served).
declare -A requires=(
  [$metadata@$metadata_version]=$metadata/client@$metadata_version
)
for name in "${!own_module[@]}"; do
  m=${own_module[$name]}
  pkgs[$name]=${m%@*}/cmd/$name@${m##*@}
done

temps=()   # removed on exit, built or not
trap 'rm -rf "${temps[@]}"' EXIT

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet
  containerd containerd-shim-runc-v2 ctr)
if [ "${names[*]}" = snapshot-crds ]; then
  # Named by both versions: the directory once held only the snapshot.storage
  # CRDs, then those and the group ones.
  crds="$cache/snapshot-crds-$snapshotter_version-metadata-$metadata_version"
  if [ ! -d "$crds" ]; then
    mkdir -p "$cache"
    exec 9>"$cache/controlplane-$key.lock"
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
for name in "${names[@]}"; do
  [ "$name" != snapshot-crds ] || { echo "snapshot-crds prints its own directory: ask for it alone" >&2; exit 2; }
  [ -n "${pkgs[$name]:-}" ] || { echo "unknown tool: $name (known: ${!pkgs[*]} snapshot-crds)" >&2; exit 2; }
done

# The Kubernetes module's own version, so `kubectl get nodes` shows it.
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$mod/go.mod")
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
version_pkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $version_pkg.gitVersion=$k8s_version -X $version_pkg.gitMajor=1 -X $version_pkg.gitMinor=$k8s_minor"

# A binary built at another version than the pinned one is rebuilt.
built() {
  [ -x "$bin/$1" ] || return 1
  case "${pkgs[$1]}" in
    *@*) [ "$(cat "$bin/$1.version" 2>/dev/null)" = "${pkgs[$1]##*@}" ] ;;
  esac
}

# copy_module module@version: a writable copy of the downloaded module with
# its replaces to local paths dropped (and $requires added).
copy_module() {
  local json src dst old
  json=$(cd / && go mod download -json "$1") || { echo "$json" >&2; return 1; }
  src=$(echo "$json" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  dst=$(mktemp -d "$cache/.src.XXXX")   # the caller removes it (this runs in $(...))
  cp -r "$src/." "$dst/"
  chmod -R u+w "$dst"
  # `replace a [v] => ./dir` (single or in a block) -> a[@v]
  while read -r old; do
    (cd "$dst" && go mod edit -dropreplace="$old")
  done < <(awk '{sub(/^replace[ \t]+/, "")} /=>[ \t]*(\.|\/)/ {print ($2 == "=>" ? $1 : $1 "@" $2)}' "$dst/go.mod")
  if [ -n "${requires[$1]:-}" ]; then
    (cd "$dst" && go mod edit -require="${requires[$1]}")
  fi
  echo "$dst"
}

# cold_seconds: each build with an empty Go build cache on this kind of
# machine (2 cores; measured 2026-12-07, in this order: later ones reuse
# the libraries the earlier ones compiled), for the progress lines.
declare -A cold_seconds=(
  [etcd]=60 [kube-apiserver]=300 [kube-controller-manager]=120 [kube-scheduler]=30 [kubelet]=60 [kubectl]=60
  [containerd]=150 [containerd-shim-runc-v2]=20 [ctr]=20 [versitygw]=300 [helm]=180
  [csi-provisioner]=5 [csi-attacher]=5 [csi-resizer]=5
  [csi-snapshotter]=5 [snapshot-controller]=5 [csi-snapshot-metadata]=90
)
# The five sidecars of scripts/tools/sidecars: 125 s cold for the first,
# 4-5 s for each of the others (2m20s for all five; as modules of their
# own they took 145-166 s each).
sidecar_libraries_seconds=120

missing=0
for name in "${names[@]}"; do built "$name" || missing=1; done

if [ "$missing" = 1 ]; then
  # One builder at a time: parallel test packages and `make run` may all ask.
  mkdir -p "$cache"
  exec 9>"$cache/controlplane-$key.lock"
  flock 9
  todo=()
  for name in "${names[@]}"; do built "$name" || todo+=("$name"); done
  # The first sidecar built compiles the libraries all five share.
  declare -A estimate=()
  total=0 shared=0
  for name in "${todo[@]}"; do
    estimate[$name]=${cold_seconds[$name]:-120}
    if [ -n "${sidecars[$name]:-}" ] && [ "$shared" = 0 ]; then
      estimate[$name]=$((estimate[$name] + sidecar_libraries_seconds)); shared=1
    fi
    total=$((total + estimate[$name]))
  done
  [ ${#todo[@]} -eq 0 ] || echo "building ${#todo[@]} tools into $bin: ${todo[*]}; with an empty Go build cache about $((total / 60 + 1)) min on 2 cores, much less once it holds their libraries" >&2
  i=0
  for name in "${todo[@]}"; do
    i=$((i + 1))
    echo "[$i/${#todo[@]}] building $name (${pkgs[$name]}); cold about ${estimate[$name]} s" >&2
    start=$(date +%s)
    mkdir -p "$bin"
    if [ -n "${own_module[$name]:-}" ]; then
      m=${own_module[$name]}
      src=$(copy_module "$m")
      temps+=("$src")
      (cd "$src" && go build -mod=mod -trimpath -ldflags="-s -w -X main.version=${m##*@}" \
        -o "$bin/$name.tmp" "./cmd/$name")
    elif [ -n "${sidecars[$name]:-}" ]; then
      (cd "$sidecar_mod" && go build -trimpath -ldflags="-s -w -X main.version=$(sidecar_version "$name")" \
        -o "$bin/$name.tmp" "${sidecars[$name]}/cmd/$name")
    else
      case "${pkgs[$name]}" in
        *@*) # outside the tools module: containerd's own go.mod decides its dependencies
          tmp=$(mktemp -d "$bin/.gobin.XXXX")
          GOBIN="$tmp" go install -trimpath -ldflags="-s -w ${ldflags[$name]:-}" -tags no_btrfs "${pkgs[$name]}"
          mv "$tmp/$name" "$bin/$name.tmp"; rm -rf "$tmp" ;;
        *)
          (cd "$mod" && go build -trimpath -ldflags="$k8s_ldflags" -o "$bin/$name.tmp" "${pkgs[$name]}") ;;
      esac
    fi
    mv "$bin/$name.tmp" "$bin/$name"   # atomic: a half-written binary is never found
    # stamped after the move: an interruption between the two costs a rebuild,
    # never an old binary taken for the pinned version
    case "${pkgs[$name]}" in *@*) echo "${pkgs[$name]##*@}" >"$bin/$name.version" ;; esac
    echo "  $name built in $(( $(date +%s) - start ))s" >&2
  done
fi
echo "$bin"
