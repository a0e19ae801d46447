#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 5s): make test runs it
# briefly; make fuzz runs it for longer (FUZZTIME=2m make fuzz). A crash
# leaves its input under the package's testdata/fuzz/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}
fail=0
while read -r pkg target; do
  echo "fuzz $pkg $target for $fuzztime"
  go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" "./$pkg" >/tmp/strata-fuzz.$$ 2>&1 ||
    { cat /tmp/strata-fuzz.$$; fail=1; }
done < <(grep -rl --include='*_test.go' '^func Fuzz' engine internal | sort | while read -r f; do
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r t; do echo "$(dirname "$f") $t"; done
done)
rm -f /tmp/strata-fuzz.$$
exit "$fail"
