#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what is missing, then
#   1. the default build (optimised, assertions on): every test;
#   2. ASan+UBSan (at -O1): every test not labelled "slow";
#   3. TSan: the tests labelled "concurrent" (only the `checks` target is built);
#   4. libFuzzer targets (clang), each for FUZZ_SECONDS (default 20) from its seed corpus,
#      FUZZ_JOBS (default: one per CPU) at a time;
# and before them a check that every C file follows .clang-format.
# Ends with one line "suite: N passed, M failed". Exit status 0 only if everything passed.
set -uo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${FUZZ_SECONDS:-20}
fuzz_jobs=${FUZZ_JOBS:-$(nproc)}
for v in "FUZZ_SECONDS=$fuzz_seconds" "FUZZ_JOBS=$fuzz_jobs"; do
	case ${v#*=} in
	'' | *[!0-9]* | 0) echo "test.sh: $v: expected a whole number of at least 1" >&2 && exit 2 ;;
	esac
done
scripts/deps.sh || exit 1

passed=0
failed=0
failures=()

run_ctest() { # name dir [ctest args…]
	local name=$1 dir=$2
	shift 2
	echo "== $name"
	local log
	log=$(mktemp)
	${ctest_wrap:-} ctest --test-dir "$dir" --output-on-failure --no-tests=ignore -j2 "$@" 2>&1 | tee "$log"
	local rc=${PIPESTATUS[0]}
	local line
	line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)
	if [ -n "$line" ]; then
		local f t
		f=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
		t=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")
		passed=$((passed + t - f))
		failed=$((failed + f))
		[ "$f" -eq 0 ] && [ "$rc" -eq 0 ] || failures+=("$name")
	elif [ "$rc" -ne 0 ]; then
		failed=$((failed + 1))
		failures+=("$name (ctest exit $rc)")
	else
		echo "($name: no tests selected)"
	fi
	rm -f "$log"
}

build_or_fail() { # name dir [cmake args…]
	local name=$1
	shift
	echo "== build: $name"
	if ! scripts/build.sh "$@"; then
		failed=$((failed + 1))
		failures+=("build $name")
		return 1
	fi
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

# Formatting is part of the build contract (.clang-format at the root).
echo "== format"
unformatted=$(git ls-files '*.c' '*.h' | grep -v '^tests/fuzz/corpus/' |
	while read -r f; do clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
if [ -z "$unformatted" ]; then
	echo "format: ok"
	passed=$((passed + 1))
else
	echo "format: these files differ from .clang-format (run clang-format -i):"
	echo "$unformatted"
	failed=$((failed + 1))
	failures+=("format")
fi

# The default build and test_packages' package build (a configure of its own: prefix /usr, no
# tests) compile the same sources with the same flags: through ccache, with paths taken
# relative to the source tree (test_packages builds beside build/ when CCACHE_DIR is set), the
# second takes the first's objects instead of compiling them again.
default_args=()
if command -v ccache >/dev/null; then
	export CCACHE_DIR=$PWD/.ccache CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
	default_args=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
build_or_fail default build "${default_args[@]}" && run_ctest default build
# -O1, as AddressSanitizer's documentation advises: at -O0 every SIMD intrinsic of the kernels
# is a call with its operands on the stack (test_kernel_ffn and test_forward_numa take half
# the CPU time at -O1). -g1: the line tables and function names the reports print, without
# the rest of the debug information (the build took 135 s with -g, 99 s so).
build_or_fail asan+ubsan build-asan -DMOE_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug \
	"-DCMAKE_C_FLAGS_DEBUG=-g1 -O1" &&
	run_ctest asan+ubsan build-asan -LE slow

# TSan's shadow layout needs at most 28 bits of mmap randomisation (newer kernels use 32).
tsan_wrap=""
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then
	if [ "$(id -u)" -eq 0 ]; then sysctl -qw vm.mmap_rnd_bits=28; else tsan_wrap="setarch $(uname -m) -R"; fi
fi
build_or_fail tsan build-tsan --target checks -DMOE_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug &&
	ctest_wrap=$tsan_wrap run_ctest tsan build-tsan -L concurrent

if command -v clang >/dev/null; then
	# -O1 with line tables, as libFuzzer's documentation builds: RelWithDebInfo (-O3 -g here)
	# took 205 s of the idle VM for the same executions per second (fuzz_forward 0.89x,
	# fuzz_gguf 1.08x) and coverage.
	if CC=clang build_or_fail fuzz build-fuzz --target fuzzers -DMOE_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
		"-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only"; then
		# Each target is one process on one CPU: FUZZ_JOBS of them at a time (default one per
		# CPU), each still fuzzing for FUZZ_SECONDS; reported in the list's order.
		echo "== fuzz (${fuzz_seconds}s each, $fuzz_jobs at a time)"
		fuzzers=$(cat build-fuzz/fuzzers.txt 2>/dev/null)
		mkdir -p build-fuzz/artifacts
		for fz in $fuzzers; do
			while [ "$(jobs -rp | wc -l)" -ge "$fuzz_jobs" ]; do wait -n; done
			bin=$(find build-fuzz -type f -name "$fz" -perm -u+x | head -1)
			seeds=tests/fuzz/corpus/$fz
			work=build-fuzz/corpus/$fz
			mkdir -p "$work"
			rm -f build-fuzz/"$fz".rc
			(
				"$bin" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
					-print_final_stats=0 -artifact_prefix=build-fuzz/artifacts/"$fz"- \
					"$work" $([ -d "$seeds" ] && echo "$seeds") >build-fuzz/"$fz".log 2>&1
				echo $? >build-fuzz/"$fz".rc
			) &
		done
		wait
		for fz in $fuzzers; do
			if [ "$(cat build-fuzz/"$fz".rc 2>/dev/null)" = 0 ]; then
				echo "fuzz $fz: ok ($(grep -Eo '#[0-9]+' build-fuzz/"$fz".log | tail -1 | tr -d '#') runs)"
				passed=$((passed + 1))
			else
				echo "fuzz $fz: FAILED"; tail -40 build-fuzz/"$fz".log
				failed=$((failed + 1)); failures+=("fuzz $fz")
			fi
		done
	fi
else
	echo "== fuzz: skipped (clang not installed)"
fi

[ ${#failures[@]} -eq 0 ] || echo "failed: ${failures[*]}"
echo "suite: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
