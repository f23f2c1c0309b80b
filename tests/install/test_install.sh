#!/usr/bin/env bash
# test_install.sh BUILD CONSUMER_DIR SIDECAR GEN SANITIZE CC — see CMakeLists.txt beside it.
# Prints one line per check; exits non-zero at the first that fails, saying which.
set -euo pipefail
build=$1 consumer=$2 sidecar=$3 gen=$4 sanitize=$5 cc=$6
case $(basename "$cc") in
*clang*) cxx=clang++ ;;
*) cxx=c++ ;;
esac

work=$(mktemp -d /tmp/moe-test-install.XXXXXX)
sidecar_pid=""
cleanup() {
	[ -n "$sidecar_pid" ] && kill -TERM "$sidecar_pid" 2>/dev/null && wait "$sidecar_pid" || true
	rm -rf "$work"
}
trap cleanup EXIT
fail() {
	echo "test_install: FAIL: $*" >&2
	exit 1
}
ok() { echo "test_install: ok: $*"; }

san_flags=()
[ -n "$sanitize" ] && san_flags=("-fsanitize=$sanitize" -fno-omit-frame-pointer)

# 1. Install.
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" ||
	{ cat "$work/install.log"; fail "cmake --install"; }
inc=$prefix/include
lib=$(dirname "$(find "$prefix" -name 'libmoe_client.so.1' -print -quit)")
[ -d "$lib" ] || fail "no libmoe_client.so.1 under $prefix"
for f in "$inc/moe_client.h" "$inc/moe_abi.h" "$lib/libmoe_client.a" "$lib/libmoe_client.so" \
	"$lib/pkgconfig/moe-client.pc" "$lib/cmake/MoeClient/MoeClientConfig.cmake"; do
	[ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done
n_headers=$(find "$inc" -type f | wc -l)
[ "$n_headers" -eq 2 ] || fail "$n_headers public headers installed, want moe_client.h and moe_abi.h"
ok "installed: include/{moe_client.h,moe_abi.h}, ${lib#"$prefix"/}/{libmoe_client.a,libmoe_client.so.1}, moe-client.pc, MoeClient CMake package"

# 2. The soname and the exported symbols: only the API.
soname=$(objdump -p "$lib/libmoe_client.so.1" | awk '/SONAME/ {print $2}')
[ "$soname" = "libmoe_client.so.1" ] || fail "soname is '$soname'"
exported=$(nm -D --defined-only "$lib/libmoe_client.so.1" | awk '{print $3}' | sort)
stray=$(grep -v '^moe_' <<<"$exported" || true)
[ -z "$stray" ] || fail "exported beyond the API: $(echo $stray)"
declared=$(grep -oE '^MOE_API [^(]*\(' "$inc/moe_client.h" | grep -oE '[a-z_0-9]+\($' | tr -d '(' | sort)
[ "$exported" = "$declared" ] || fail "exported symbols differ from the header's MOE_API functions:
$(diff <(echo "$exported") <(echo "$declared") || true)"
needed=$(objdump -p "$lib/libmoe_client.so.1" | awk '/NEEDED/ {print $2}' | grep -v -E '^(libc\.so|ld-linux|libasan|libubsan|libtsan|libm\.so|libstdc\+\+|libgcc_s)' || true)
[ -z "$needed" ] || fail "libmoe_client.so.1 needs other libraries: $needed"
ok "soname $soname; $(wc -l <<<"$exported") symbols exported, all moe_*, exactly the header's; needs only libc"

# 3. The headers as strict C11 and C++17.
printf '#include <moe_client.h>\nint main(void) { return moe_status_str(MOE_OK)[0] == 0 && MOE_DTYPE_BF16 == 2 ? 0 : 1; }\n' >"$work/h.c"
cp "$work/h.c" "$work/h.cpp"
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic -I"$inc" -c "$work/h.c" -o "$work/h.o" ||
	fail "moe_client.h as C11"
"$cxx" -std=c++17 -Wall -Wextra -Werror -pedantic -I"$inc" -c "$work/h.cpp" -o "$work/hpp.o" ||
	fail "moe_client.h as C++17"
ok "moe_client.h compiles with -std=c11 and -std=c++17 -Wall -Wextra -Werror -pedantic"

# 4. Through pkg-config: dynamic, and static (the archive named, pkg-config's flags kept).
export PKG_CONFIG_PATH=$lib/pkgconfig
cflags=$(pkg-config --cflags moe-client)
libs=$(pkg-config --libs moe-client)
libdir=$(pkg-config --variable=libdir moe-client)
[ "$(realpath "$libdir")" = "$(realpath "$lib")" ] || fail "moe-client.pc libdir $libdir is not $lib"
bin=$work/bin
mkdir -p "$bin"
"$cc" -std=c11 "${san_flags[@]}" $cflags "$consumer/consumer.c" -o "$bin/pc_c_shared" $libs -lm
"$cc" -std=c11 "${san_flags[@]}" $cflags "$consumer/consumer.c" -o "$bin/pc_c_static" "$libdir/libmoe_client.a" -lm
"$cxx" -std=c++17 "${san_flags[@]}" $cflags "$consumer/consumer.cpp" -o "$bin/pc_cxx_shared" $libs
"$cxx" -std=c++17 "${san_flags[@]}" $cflags "$consumer/consumer.cpp" -o "$bin/pc_cxx_static" "$libdir/libmoe_client.a"
ok "pkg-config moe-client: built C and C++, shared and static"

# 5. Through CMake's find_package(MoeClient).
flags="${san_flags[*]}"
cmake -S "$consumer" -B "$work/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
	-DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >"$work/consumer.log" 2>&1 ||
	{ cat "$work/consumer.log"; fail "configuring the find_package(MoeClient) project"; }
cmake --build "$work/consumer-build" >>"$work/consumer.log" 2>&1 ||
	{ cat "$work/consumer.log"; fail "building the find_package(MoeClient) project"; }
for v in c_shared c_static cxx_shared cxx_static; do
	cp "$work/consumer-build/consumer_$v" "$bin/cmake_$v"
done
ok "find_package(MoeClient): built MoeClient::moe_client and MoeClient::moe_client_static consumers"

# Shared ones load the installed .so.1; static ones need no libmoe_client at all.
for b in "$bin"/*; do
	deps=$(LD_LIBRARY_PATH=$lib ldd "$b")
	case $b in
	*_shared) grep -q "libmoe_client.so.1 => $lib" <<<"$deps" || fail "$(basename "$b") does not load $lib/libmoe_client.so.1: $deps" ;;
	*_static) ! grep -q libmoe_client <<<"$deps" || fail "$(basename "$b") is not static: $deps" ;;
	esac
done

# 6. Each one runs a FORWARD against a served model.
model=$work/model.gguf
"$gen" --preset qwen3-30b-a3b --layers 2 --experts 8 --hidden 256 --ffn 128 --format q8_0 \
	--seed 5 --out "$model" >/dev/null
sock=$work/run/sidecar.sock
mkfifo "$work/ready"
"$sidecar" serve "$model" --socket "$sock" --probes-instance "test-install-$$" \
	--log-level warn --ready-fd 3 3>"$work/ready" 2>"$work/sidecar.log" &
sidecar_pid=$!
read -r -t 60 _ <"$work/ready" || { cat "$work/sidecar.log"; fail "the sidecar did not start"; }
for b in "$bin"/*; do
	out=$(LD_LIBRARY_PATH=$lib "$b" "$sock" 2>&1) || fail "$(basename "$b"): $out"
	ok "$(basename "$b"): $out"
done
kill -TERM "$sidecar_pid"
wait "$sidecar_pid" || fail "the sidecar exited with status $?"
sidecar_pid=""
echo "test_install: passed"
