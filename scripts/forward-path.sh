#!/usr/bin/env bash
# scripts/forward-path.sh [--src TREE] [--json FILE] [BUILD_DIR]: the path of one FORWARD.
#
# Counts the files visited and the cross-file calls of one steady-state decode FORWARD (1 token,
# top-k experts, every expert resident), from moe_forward in the client to its completion, in
# both processes. It builds TREE (default: this checkout) into BUILD_DIR (default:
# TREE/build-calls) with -finstrument-functions on the project's C code and the hooks of
# scripts/forward-path/call_hooks.c linked into every program (flags on the cmake command
# line only; MOE_PROBES=OFF; only moe-sidecar, moe-gen and libmoe_client.a are built), links
# scripts/forward-path/driver.c against that libmoe_client.a, generates a small model with
# the tree's moe-gen, and runs the driver: it starts `moe-sidecar serve --mem-budget 100%`,
# warms every MoE layer up, switches recording on (SIGUSR1 to the sidecar, a call in
# itself), calls moe_forward once, switches it off (SIGUSR2 once no sidecar thread runs: the
# sidecar dumps), and stops the sidecar. scripts/forward-path/analyze.py maps the records to
# functions and source files (addr2line) and prints the files visited, the distinct
# cross-file edges (caller function in file A -> callee in file B, A != B), the dynamic
# cross-file calls, per file the entries from another file, and the threads seen; kernels/
# apart; then the same with .c files only (a header's inline function counted in the .c file
# that called it). --json FILE writes it all as JSON. FP_JOBS: build jobs (default 2).
#
# Another tree (an older commit) with this checkout's tool:
#   git worktree add /tmp/old COMMIT && scripts/forward-path.sh --src /tmp/old /tmp/fp-old
# The model: FP_GEN_ARGS (default a small qwen3-30b-a3b: 4 layers x 16 experts, hidden 256,
# ffn 128, q8_0); the layer measured: FP_LAYER (default: the second MoE layer); the sidecar's
# --spin-us: FP_SPIN_US (default 0, so the dispatcher's idle polling, whose length is a matter of
# timing, stays out of the window; its wake-up and going back to sleep are in it). The driver
# runs FP_RUNS times (default 3, a fresh sidecar each): whether the client sleeps before its
# completion, and how long the pool spins, are a matter of timing, so the report gives the
# union of the files and edges (marking those not seen in every run) and median counts.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
json=""
while [ $# -gt 0 ]; do
	case $1 in
	--src) src=$(cd "$2" && pwd); shift 2 ;;
	--json) json=$2; shift 2 ;;
	-h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
build=${1:-$src/build-calls}
mkdir -p "$build"
build=$(cd "$build" && pwd)
jobs=${FP_JOBS:-2}
py=/usr/bin/python3

# 1. The hooks (never instrumented; PIC, since the shared client library links them too).
mkdir -p "$build/fp"
cc -std=gnu11 -O2 -g -fPIC -Wall -Wextra -c "$here/forward-path/call_hooks.c" -o "$build/fp/call_hooks.o"

# 2. The instrumented build. Calls into system headers (SIMD intrinsics) are not recorded.
if [ ! -f "$build/CMakeCache.txt" ]; then
	cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_PROBES=OFF \
		-DCMAKE_C_FLAGS="-finstrument-functions -finstrument-functions-exclude-file-list=/usr/include/,/usr/lib/gcc/" \
		-DCMAKE_C_STANDARD_LIBRARIES="$build/fp/call_hooks.o" >"$build/fp/configure.log" 2>&1 ||
		{ cat "$build/fp/configure.log"; exit 1; }
fi
# The hooks are no dependency cmake knows: relink the programs each time.
rm -f "$build/sidecar/moe-sidecar" "$build/tools/moe-gen"
cmake --build "$build" -j"$jobs" --target moe-sidecar moe-gen moe_client >"$build/fp/build.log" 2>&1 ||
	{ tail -50 "$build/fp/build.log"; exit 1; }

# 3. The driver (not instrumented: moe_forward is where the path starts).
cc -std=gnu11 -O2 -g -Wall -Wextra -I"$src/client/include" -I"$src/proto/include" \
	"$here/forward-path/driver.c" "$build/client/libmoe_client.a" "$build/fp/call_hooks.o" \
	-lpthread -o "$build/fp/driver"

# 4. The model, then the run.
gen_args=${FP_GEN_ARGS:---preset qwen3-30b-a3b --layers 4 --experts 16 --hidden 256 --ffn 128 --format q8_0}
model=$build/fp/model.gguf
if [ ! -s "$model" ] || [ "$(cat "$build/fp/model.args" 2>/dev/null)" != "$gen_args" ]; then
	# shellcheck disable=SC2086
	"$build/tools/moe-gen" $gen_args --quiet --out "$model.tmp.gguf" >/dev/null
	mv "$model.tmp.gguf" "$model"
	echo "$gen_args" >"$build/fp/model.args"
fi
runs=${FP_RUNS:-3}
rm -rf "$build/fp/run" "$build"/fp/run[0-9]*
run_args=()
for i in $(seq 1 "$runs"); do
	out=$build/fp/run$i
	mkdir -p "$out"
	# shellcheck disable=SC2086
	"$build/fp/driver" --sidecar "$build/sidecar/moe-sidecar" --model "$model" --out "$out" \
		${FP_LAYER:+--layer "$FP_LAYER"} ${FP_SPIN_US:+--spin-us "$FP_SPIN_US"}
	run_args+=(--run "$out")
done

# 5. The analysis.
"$py" "$here/forward-path/analyze.py" --src "$src" "${run_args[@]}" ${json:+--json "$json"}
