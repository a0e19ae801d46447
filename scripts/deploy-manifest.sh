#!/usr/bin/env bash
# Prints package/deploy/strata.yaml: the chart package/chart/strata rendered
# with its default values, its CRDs and the Namespace (kubectl apply cannot
# create it), for installs without Helm. `make deploy-manifest` writes it;
# make verify and package/deploy's test fail when the file differs.
# helm is built once and cached by scripts/build-tools.sh ($HELM overrides).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
helm=${HELM:-$("$root/scripts/build-tools.sh" helm)/helm}
cat <<'HEADER'
# Strata, rendered from package/chart/strata with its default values by
# `make deploy-manifest` (scripts/deploy-manifest.sh); do not edit. Install:
#   kubectl apply --server-side -f strata.yaml
# (run it twice if it says to ensure the CRDs are installed first: the
# VolumeSnapshotClass needs them). Helm users: package/chart/strata/README.md.
HEADER
# From the repository root, so the chart's path in the "# Source:" lines
# does not depend on where this runs.
cd "$root"
# Without hooks: the pre-delete check belongs to helm uninstall.
"$helm" template strata package/chart/strata --namespace strata-system --include-crds --no-hooks --set createNamespace=true
