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
#     upstream CSI sidecars: csi-provisioner,
#     csi-attacher, csi-resizer, csi-snapshotter, snapshot-controller and
#     csi-snapshot-metadata (about 4 min), each
#     from its own module at the version pinned in $sidecars (about 2.5-3 min
#     each with an empty build cache on 2 cores, 11 min for all five;
#     snapshot-controller takes seconds after csi-snapshotter). `go install
#     pkg@version` refuses their replace directives, so each module is copied
#     to a writable temp dir, its replaces to local paths dropped, and built
#     there with -mod=mod.
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
snapshotter_version=v8.7.0
snapshotter=github.com/kubernetes-csi/external-snapshotter
# The SnapshotMetadata sidecar and its CRD (changed-block tracking, KEP-3314).
metadata_version=v1.0.0
metadata=github.com/kubernetes-csi/external-snapshot-metadata
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
# CSI sidecars: name -> module@version; the command is the module's ./cmd/<name>.
declare -A sidecars=(
  [csi-provisioner]=github.com/kubernetes-csi/external-provisioner/v6@v6.3.0
  [csi-attacher]=github.com/kubernetes-csi/external-attacher/v4@v4.13.0
  [csi-resizer]=github.com/kubernetes-csi/external-resizer/v2@v2.3.0
  [csi-snapshotter]=$snapshotter/v8@$snapshotter_version
  [snapshot-controller]=$snapshotter/v8@$snapshotter_version
  [csi-snapshot-metadata]=$metadata@$metadata_version
)
# Requirements that replace the dropped local replaces: external-snapshotter
# points client/v8 at ./client, which its module zip does not contain;
# external-snapshot-metadata points client at ./client and names client@v0.2.0,
# which this machine's module proxy refuses (its v1.0.0 is served).
declare -A requires=(
  [$snapshotter/v8@$snapshotter_version]=$snapshotter/client/v8@$snapshotter_version
  [$metadata@$metadata_version]=$metadata/client@$metadata_version
)
for name in "${!sidecars[@]}"; do
  m=${sidecars[$name]}
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
# its replaces to local paths dropped (and $requires added); one per module
# per run (in $copies), so external-snapshotter's two commands share it.
declare -A copies=()
copy_module() {
  local json src dst old
  json=$(cd / && go mod download -json "$1") || { echo "$json" >&2; return 1; }
  src=$(echo "$json" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  dst=$(mktemp -d "$cache/.src.XXXX")
  temps+=("$dst")
  cp -r "$src/." "$dst/"
  chmod -R u+w "$dst"
  # `replace a [v] => ./dir` (single or in a block) -> a[@v]
  while read -r old; do
    (cd "$dst" && go mod edit -dropreplace="$old")
  done < <(awk '{sub(/^replace[ \t]+/, "")} /=>[ \t]*(\.|\/)/ {print ($2 == "=>" ? $1 : $1 "@" $2)}' "$dst/go.mod")
  if [ -n "${requires[$1]:-}" ]; then
    (cd "$dst" && go mod edit -require="${requires[$1]}")
  fi
  copies[$1]=$dst
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
    if [ -n "${sidecars[$name]:-}" ]; then
      # outside the tools module, from a copy of the sidecar's own module
      m=${sidecars[$name]}
      if [ -z "${copies[$m]:-}" ]; then copy_module "$m"; fi   # not in ||: keep set -e inside
      (cd "${copies[$m]}" && go build -mod=mod -trimpath -ldflags="-s -w -X main.version=${m##*@}" \
        -o "$bin/$name.tmp" "./cmd/$name")
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
