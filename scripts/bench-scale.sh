#!/usr/bin/env bash
# Real-scale decode and cold start: full-size models from the disk through the real sidecar and
# client, against the in-process floor and llama.cpp-style mmap under a cgroup memory limit
# equal to the budget (bench/decode.c does the measuring; this script makes the models once and
# drives it).
#
#   scripts/bench-scale.sh [qwen3|deepseek|all]      (default: all)
#
# Models (generated once into $MOE_SCALE_DIR, default /var/tmp/moe-scale, and reused):
#   qwen3     Qwen3-30B-A3B in full: 48 layers x 128 experts, hidden 2048, expert FFN 768,
#             top-8, llama.cpp's Q4_K_M mix (down in Q6_K on 24 layers): 17.6 GB of experts
#   deepseek  DeepSeek-V3-shaped: hidden 7168, expert FFN 2048, 256 experts, top-8, Q4_K_M
#             mix, 6 blocks of which the first 3 are dense (as the real model's): 3 MoE layers,
#             20.0 GB of experts — as many as fit in 20 GB
# Routing: the trace generator's qwen3-30b-a3b preset defaults (zipf 0.8, reuse 0.3, layer
# correlation 0.2, drift 0.1 every 64 steps; sidecar/residency/trace.c), sized to the model.
# Budgets 100/75/50/25 % of the expert bytes; prefill rows of 512 and 2048 tokens at 100 and
# 50 %. Engines run one at a time (bench_decode --sequential): 24 GiB cannot hold two copies.
# Then 50 % again with --hints none and --hints router (the next layer's router on this layer's
# input: pre-gating; on generated weights at chance, which the output says): bytes per token
# against Belady's for all three hint modes.
# Output: $MOE_SCALE_DIR/NAME.txt (table), NAME.json, NAME.png (plot); NAME-hints-H.txt/.json.
# MOE_SCALE_STEPS (default 64) timed decode steps; MOE_SCALE_ROUNDS (default 3) 100 % rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
dir=${MOE_SCALE_DIR:-/var/tmp/moe-scale}
steps=${MOE_SCALE_STEPS:-64}
rounds=${MOE_SCALE_ROUNDS:-3}
mkdir -p "$dir"
scripts/deps.sh >/dev/null
scripts/build.sh build >/dev/null

# A model is generated into NAME.tmp.gguf and renamed when complete, so an interrupted run
# never leaves a truncated model to be reused.
model() {
	local name=$1
	shift
	local out=$dir/$name.gguf
	if [ ! -s "$out" ]; then
		echo "bench-scale: generating $out ($*)" >&2
		build/tools/moe-gen "$@" --out "$out.tmp.gguf"
		mv "$out.tmp.gguf" "$out"
	fi
	echo "$out"
}

run() {
	local name=$1 path=$2
	echo "bench-scale: $name: $(build/sidecar/moe-sidecar inspect "$path" | grep -E '^(all experts|per layer)')" >&2
	build/bench/bench_decode --model "$path" --sequential --budgets 100,75,50,25 \
		--prefill 512,2048 --steps "$steps" --rounds "$rounds" --plot "$dir/$name.png" \
		--json-file "$dir/$name.json" | tee "$dir/$name.txt"
	for hints in none router; do
		build/bench/bench_decode --model "$path" --sequential --budgets 50 --steps "$steps" \
			--hints "$hints" --json-file "$dir/$name-hints-$hints.json" |
			tee "$dir/$name-hints-$hints.txt"
	done
}

lscpu | grep -E '^Model name' >&2
if [ "$which" = qwen3 ] || [ "$which" = all ]; then
	m=$(model qwen3-30b-a3b-q4_k_m --preset qwen3-30b-a3b --full --mix q4_k_m)
	run qwen3-30b-a3b-q4_k_m "$m"
fi
if [ "$which" = deepseek ] || [ "$which" = all ]; then
	m=$(model deepseek-v3-shaped-q4_k_m --preset deepseek-v3 --layers 6 --mix q4_k_m)
	run deepseek-v3-shaped-q4_k_m "$m"
fi
