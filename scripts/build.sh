#!/usr/bin/env bash
# scripts/build.sh DIR [cmake -D options…]: configure (once) and build one variant.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1; shift
mkdir -p "$dir"
cmake -S . -B "$dir" "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
set +e +o pipefail
cmake --build "$dir" -j"$(nproc)" 2>&1 | grep -Ev '^\[ *[0-9]+%\] (Building|Linking|Built target)|^Consolidate'
exit "${PIPESTATUS[0]}"
