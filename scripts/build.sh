#!/usr/bin/env bash
# scripts/build.sh DIR [--target T]… [cmake -D options…]: configure (once) and build one
# variant — every target, or only the ones named (scripts/run.sh builds what its job runs).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1; shift
targets=()
while [ $# -ge 2 ] && [ "$1" = --target ]; do
	targets+=(--target "$2")
	shift 2
done
mkdir -p "$dir"
cmake -S . -B "$dir" "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
set +e +o pipefail
cmake --build "$dir" -j"$(nproc)" "${targets[@]}" 2>&1 | grep -Ev '^\[ *[0-9]+%\] (Building|Linking|Built target)|^Consolidate'
exit "${PIPESTATUS[0]}"
