#!/usr/bin/env bash
# Installs the Debian packages the given roles need (package/hostpackages/
# packages.txt: build, node, image), or says how. Run as root on Debian it
# installs what is missing and says what; otherwise it stops with the exact
# apt-get line. Nothing missing: it prints nothing.
#
#   scripts/host-packages.sh node image     # what make run and make test need
#
# STRATA_HOST_PACKAGES names another list of the same form (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
list=${STRATA_HOST_PACKAGES:-package/hostpackages/packages.txt}
[ $# -gt 0 ] || { echo "usage: $0 ROLE..." >&2; exit 2; }

# Programs are looked up in the sbin directories too: a user's PATH often
# lacks them, and the processes that run these programs do not use PATH.
search_path="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# find_missing fills missing_files and missing_pkgs (each package once).
find_missing() {
  missing_pkgs=()
  missing_files=()
  local role pkg file rest
  while read -r role pkg file rest; do
    case "$role" in '' | '#'*) continue ;; esac
    [[ " $roles " == *" $role "* ]] || continue
    if [[ "$file" == /* ]]; then
      [ -e "$file" ] && continue
    else
      PATH="$search_path" command -v "$file" >/dev/null && continue
    fi
    missing_files+=("$file")
    [[ " ${missing_pkgs[*]-} " == *" $pkg "* ]] || missing_pkgs+=("$pkg")
  done <"$list"
}
roles="$*"
find_missing
[ ${#missing_pkgs[@]} -eq 0 ] && exit 0

line="apt-get install -y ${missing_pkgs[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "strata: missing ${missing_files[*]} (roles: $*)." >&2
  echo "strata: install them as root, then run this again:" >&2
  echo "  apt-get update && $line" >&2
  exit 1
fi
echo "strata: installing Debian packages ${missing_pkgs[*]} (missing: ${missing_files[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
# apt's and dpkg's chatter goes to a log, shown only if they fail.
apt_log=$(mktemp)
trap 'rm -f "$apt_log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}"; } >"$apt_log" 2>&1; then
  cat "$apt_log" >&2
  echo "strata: apt-get install ${missing_pkgs[*]} failed" >&2
  exit 1
fi
installed="${missing_pkgs[*]}"
find_missing
if [ ${#missing_files[@]} -gt 0 ]; then
  echo "strata: installed $installed, but ${missing_files[*]} still missing: check $list" >&2
  exit 1
fi
echo "strata: installed $installed" >&2
