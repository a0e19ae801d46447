#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 5s): make test runs it
# briefly; make fuzz runs it for longer (FUZZTIME=2m make fuzz). A crash
# leaves its input under the package's testdata/fuzz/ and fails the run.
#
# Go 1.26's fuzz coordinator can report a bare "context deadline exceeded"
# when -fuzztime expires while a worker is mid-call on a loaded machine
# (golang/go#75804, fixed in Go 1.27). That is not a finding: no input is
# written. Such a run is retried once; a real finding ("Failing input
# written to", a panic, a t.Error) fails at once, and so does a second
# deadline report.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}
log=/tmp/strata-fuzz.$$
trap 'rm -f "$log"' EXIT
fail=0

deadline_flake() {
  grep -q 'context deadline exceeded' "$log" &&
    ! grep -qE 'Failing input written to|panic:|_test\.go:[0-9]+:' "$log"
}

fuzz_one() {
  go test -run='^$' -fuzz="^$2\$" -fuzztime="$fuzztime" "./$1" >"$log" 2>&1
}

while read -r pkg target; do
  echo "fuzz $pkg $target for $fuzztime"
  fuzz_one "$pkg" "$target" && continue
  if deadline_flake; then
    echo "fuzz $pkg $target: coordinator deadline report without a finding (golang/go#75804); running again"
    fuzz_one "$pkg" "$target" && continue
  fi
  cat "$log"
  fail=1
done < <(grep -rl --include='*_test.go' '^func Fuzz' engine internal | sort | while read -r f; do
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r t; do echo "$(dirname "$f") $t"; done
done)
exit "$fail"
