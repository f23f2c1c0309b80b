#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, generate the default
# model, start `moe-sidecar serve MODEL` with half the expert bytes as its budget, replay a
# synthetic decode trace through the real channel (deferred experts and lookahead hints
# included), print tokens/s, per-layer latency, hit rates and page-cache bypass, then the
# sidecar's own stats, and stop it cleanly.
#
# The default model is Qwen3-30B-A3B-shaped (qwen3moe, top-8 of its experts, SwiGLU, Q8_0)
# scaled to a small shared machine: 8 MoE layers x 64 experts, hidden 768, expert ffn 256
# (306 MiB of experts; the real model is 48 x 128, 2048, 768). Override with MOE_RUN_GEN_ARGS,
# the number of decode steps with MOE_RUN_STEPS, the budget with MOE_RUN_BUDGET.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# Only what the job runs: the daemon, the client library, the generator and the demo (the
# tests and benchmarks are scripts/test.sh's, into the same build directory).
scripts/build.sh build --target moe-sidecar --target moe_client --target moe-gen \
	--target moe-decode-demo

gen_args=${MOE_RUN_GEN_ARGS:---preset qwen3-30b-a3b --layers 8 --experts 64 --hidden 768 --ffn 256 --format q8_0}
steps=${MOE_RUN_STEPS:-256}
budget=${MOE_RUN_BUDGET:-50%}

# The model is kept between runs (build/models/, keyed by the generator arguments).
mkdir -p build/models
model=build/models/$(echo "$gen_args" | sed 's/--preset //; s/ --/_/g; s/ //g' | tr -c 'A-Za-z0-9_.-' '_' | sed 's/_*$//').gguf
if [ ! -s "$model" ]; then
	echo "run: generating $model ($gen_args)"
	# shellcheck disable=SC2086
	build/tools/moe-gen $gen_args --out "$model.tmp.gguf"
	mv "$model.tmp.gguf" "$model"
fi

work=$(mktemp -d /tmp/moe-sidecar-run.XXXXXX)
sidecar_pid=""
cleanup() {
	[ -n "$sidecar_pid" ] && kill -TERM "$sidecar_pid" 2>/dev/null && wait "$sidecar_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

sock=$work/sidecar.sock
mkfifo "$work/ready"
build/sidecar/moe-sidecar serve "$model" --mem-budget "$budget" --socket "$sock" \
	--probes-instance "run-$$" --ready-fd 3 3>"$work/ready" &
sidecar_pid=$!
read -r -t 60 ready <"$work/ready" || { echo "run: sidecar did not become ready" >&2; exit 1; }

echo
build/client/moe-decode-demo --socket "$sock" --steps "$steps" --k-defer 1
echo
build/sidecar/moe-sidecar stats --socket "$sock"

kill -TERM "$sidecar_pid"
status=0
wait "$sidecar_pid" || status=$?
sidecar_pid=""
if [ "$status" -ne 0 ]; then
	echo "run: sidecar exited with status $status" >&2
	exit 1
fi
echo "run: sidecar stopped cleanly (exit 0)"
