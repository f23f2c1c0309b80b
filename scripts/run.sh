#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, start the sidecar,
# run a client through the real channel, print a summary, stop the sidecar cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build

work=$(mktemp -d /tmp/moe-sidecar-run.XXXXXX)
sidecar_pid=""
cleanup() {
	[ -n "$sidecar_pid" ] && kill -TERM "$sidecar_pid" 2>/dev/null && wait "$sidecar_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

sock=$work/sidecar.sock
mkfifo "$work/ready"
build/sidecar/moe-sidecar serve --socket "$sock" --ready-fd 3 3>"$work/ready" &
sidecar_pid=$!
read -r -t 30 ready <"$work/ready" || { echo "run: sidecar did not become ready" >&2; exit 1; }

build/client/moe-echo-demo --socket "$sock"

kill -TERM "$sidecar_pid"
wait "$sidecar_pid"
status=$?
sidecar_pid=""
echo "run: sidecar stopped cleanly (exit $status)"
