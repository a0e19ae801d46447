#!/usr/bin/env bash
# make verify: the checks that keep generated code, module files, the Helm
# chart's rendering and a few project rules honest. Exits non-zero on the
# first class of failure found, after reporting every finding in it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fail=0
say() { printf '%s\n' "$*" >&2; }

hand_written() {  # Go files not produced by a generator
  git ls-files --cached --others --exclude-standard -- '*.go' |
    grep -v -e '^k8s/pkg/client/' -e 'zz_generated' -e '\.pb\.go$' -e '^scripts/tools/'
}

say "== gofmt"
bad=$(gofmt -l $(hand_written) || true)
[ -z "$bad" ] || { say "not gofmt-formatted:"; say "$bad"; fail=1; }

say "== go vet"
go vet ./... || fail=1

say "== go.mod tidy"
go mod tidy -diff || { say "go.mod/go.sum are not tidy: run go mod tidy"; fail=1; }
for tools in scripts/tools/cluster scripts/tools/conformance; do
  (cd "$tools" && go mod tidy -diff) || { say "$tools is not tidy"; fail=1; }
done

say "== informer resync is 0"
# Every informer factory and informer must be built with datastore.ResyncPeriod
# (which must be 0) or a literal 0; per-handler resyncs are not used at all.
grep -q '^const ResyncPeriod = 0$' datastore/datastore.go || { say "datastore.ResyncPeriod must be 0"; fail=1; }
while IFS= read -r hit; do
  case "$hit" in
    *ResyncPeriod*|*", 0)"*|*", 0,"*) ;;
    *) say "informer with a resync period other than 0: $hit"; fail=1 ;;
  esac
done < <(grep -nE 'New(Shared)?(Index)?InformerFactory(WithOptions)?\(|NewSharedIndexInformer\(|NewSharedInformer\(|NewIndexerInformer\(|NewInformer\(' $(hand_written) || true)
if grep -nE 'AddEventHandlerWithResyncPeriod|WithResyncPeriod\(' $(hand_written); then
  say "per-handler resync periods are not allowed"; fail=1
fi

say "== imports follow the layers"
# No import up the layers or across controller families, no development
# tool in the strata binary (docs/architecture.md draws the layers).
go run ./scripts/check-imports >&2 || fail=1

say "== file length"
while read -r n f; do
  [ "$f" = total ] && continue
  [ "$n" -le 800 ] || { say "$f has $n lines; split plumbing from logic or by concern (limit 800)"; fail=1; }
done < <(wc -l $(hand_written))

say "== helm chart"
# helm is built once into the tools cache (a few minutes cold) and reused.
helm_bin=$(scripts/build-tools.sh helm)/helm
chart=package/chart/strata
{ diff -r k8s/crds "$chart/crds" && diff -r "$(scripts/build-tools.sh snapshot-crds)" "$chart/charts/snapshot-crds/crds"; } >&2 ||
  { say "the chart's CRDs are not copies of k8s/crds and the snapshot CRDs: run make deploy-manifest"; fail=1; }
"$helm_bin" lint --strict --with-subcharts "$chart" >&2 || { say "helm lint: $chart has findings"; fail=1; }
if ! HELM="$helm_bin" scripts/deploy-manifest.sh | diff -u package/deploy/strata.yaml - >&2; then
  say "package/deploy/strata.yaml is not what the chart renders: run make deploy-manifest"; fail=1
fi

say "== generated code is current"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generated=(k8s/crds k8s/pkg/client k8s/pkg/apis/strata/v1beta1/zz_generated.deepcopy.go engineapi/impb)
tar -cf "$tmp/before.tar" "${generated[@]}"
{ k8s/codegen.sh && engineapi/generate.sh; } >"$tmp/codegen.log" 2>&1 || { cat "$tmp/codegen.log" >&2; tar -xf "$tmp/before.tar"; exit 1; }
mkdir "$tmp/after" && tar -cf - "${generated[@]}" | tar -xf - -C "$tmp/after"
# Put back exactly what was there, so verify never edits the tree.
rm -rf "${generated[@]}" && tar -xf "$tmp/before.tar"
drift=0
for g in "${generated[@]}"; do
  diff -ru "$g" "$tmp/after/$g" >&2 || drift=1
done
[ "$drift" = 0 ] || { say "generated code is stale: run make generate and commit the result"; fail=1; }

[ "$fail" = 0 ] && say "verify: all checks passed"
exit "$fail"
