#!/usr/bin/env bash
# test_packages.sh SOURCE CONSUMER_DIR VERSION CC — see CMakeLists.txt beside it.
# The Debian packages as a user gets them: a package build (a fresh configure with the prefix
# /usr, no tests) and `cpack -G DEB`; each package's control fields, dependencies and files
# (dpkg-deb -I/-f/-c); lintian without errors; then the three extracted into an empty root,
# the daemon's --version, and a client built against the extracted -dev package (pkg-config
# and find_package) doing a FORWARD against the extracted daemon serving a model made by the
# extracted moe-gen. Exit 77 (skipped) without dpkg-deb, dpkg-shlibdeps or lintian.
set -euo pipefail
src=$1 consumer=$2 version=$3 cc=$4

for tool in dpkg-deb dpkg-shlibdeps lintian cpack file pkg-config; do
	if ! command -v "$tool" >/dev/null; then
		echo "test_packages: skipped: $tool is not installed (scripts/deps.sh installs dpkg-dev, file, lintian)"
		exit 77
	fi
done

work=$(mktemp -d /tmp/moe-test-packages.XXXXXX)
sidecar_pid=""
launcher=()
cleanup() {
	[ -n "$sidecar_pid" ] && kill -TERM "$sidecar_pid" 2>/dev/null && wait "$sidecar_pid" || true
	rm -rf "$work"
	[ "${#launcher[@]}" -eq 0 ] || rm -rf "$build"
}
trap cleanup EXIT
fail() {
	echo "test_packages: FAIL: $*" >&2
	exit 1
}
ok() { echo "test_packages: ok: $*"; }

# 1. The package build: what a Debian build does, prefix /usr, without the tests
# (MOE_TEST_PACKAGES_BUILD=DIR: an existing one, configured so, instead). Under
# scripts/test.sh (CCACHE_DIR and CCACHE_BASEDIR set, the default build compiled through
# ccache) it builds beside the source's build/ through ccache, so that the paths ccache hashes
# are the same and the objects the default build compiled are taken, not compiled again.
launcher=()
if [ -z "${MOE_TEST_PACKAGES_BUILD:-}" ] && [ -n "${CCACHE_DIR:-}" ] &&
	[ "${CCACHE_BASEDIR:-}" = "$src" ] && command -v ccache >/dev/null; then
	build=$src/build-packages-test
	rm -rf "$build"
	launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
else
	build=${MOE_TEST_PACKAGES_BUILD:-$work/build}
fi
[ -n "${MOE_TEST_PACKAGES_BUILD:-}" ] || cmake -S "$src" -B "$build" -DCMAKE_INSTALL_PREFIX=/usr -DMOE_BUILD_TESTS=OFF \
	-DMOE_TEST_HOOKS=OFF -DCMAKE_C_COMPILER="$cc" "${launcher[@]}" >"$work/configure.log" 2>&1 ||
	{ cat "$work/configure.log"; fail "configuring the package build"; }
cmake --build "$build" -j"$(nproc)" >"$work/build.log" 2>&1 ||
	{ tail -50 "$work/build.log"; fail "the package build"; }
(cd "$build" && cpack -G DEB -B "$work/out") >"$work/cpack.log" 2>&1 ||
	{ cat "$work/cpack.log"; fail "cpack -G DEB"; }
arch=$(dpkg --print-architecture)
deb_version=$version-1
declare -A deb
for p in moe-sidecar libmoe-client1 libmoe-client-dev; do
	deb[$p]=$work/out/${p}_${deb_version}_$arch.deb
	[ -f "${deb[$p]}" ] || fail "cpack made no ${deb[$p]##*/}: $(ls "$work/out")"
done
n_debs=$(find "$work/out" -maxdepth 1 -name '*.deb' | wc -l)
[ "$n_debs" -eq 3 ] || fail "cpack made $n_debs packages, want 3: $(ls "$work/out")"
ok "cpack -G DEB: $(cd "$work/out" && ls -s --block-size=K -- *.deb | tr '\n' ' ')"

# 2. Control fields.
field() { dpkg-deb -f "${deb[$1]}" "$2"; }
for p in "${!deb[@]}"; do
	[ "$(field "$p" Package)" = "$p" ] || fail "$p: Package is '$(field "$p" Package)'"
	[ "$(field "$p" Version)" = "$deb_version" ] || fail "$p: Version is '$(field "$p" Version)'"
	[ "$(field "$p" Architecture)" = "$arch" ] || fail "$p: Architecture '$(field "$p" Architecture)'"
	[ "$(field "$p" Source)" = moe-sidecar ] || fail "$p: Source is '$(field "$p" Source)'"
	grep -qE '^[^<>]+ <[^<>@ ]+@[^<>@ ]+>$' <<<"$(field "$p" Maintainer)" ||
		fail "$p: Maintainer '$(field "$p" Maintainer)' is not 'Name <address>'"
	[ "$(field "$p" Description | wc -l)" -ge 3 ] || fail "$p: no long description"
done
[ "$(field moe-sidecar Section)" = misc ] || fail "moe-sidecar: Section $(field moe-sidecar Section)"
[ "$(field libmoe-client1 Section)" = libs ] || fail "libmoe-client1: Section $(field libmoe-client1 Section)"
[ "$(field libmoe-client-dev Section)" = libdevel ] ||
	fail "libmoe-client-dev: Section $(field libmoe-client-dev Section)"
ok "control: Package, Version $deb_version, Architecture $arch, Source, Maintainer, Section, Description"

# 3. Files: each where Debian wants it, each in one package only.
list() { dpkg-deb -c "${deb[$1]}" | awk '{print $6}' | sed 's|^\./|/|'; }
has() { grep -qxE "$2" <<<"$(list "$1")" || fail "$1 does not hold $2: $(list "$1" | tr '\n' ' ')"; }
lacks() {
	local hit
	hit=$(grep -E "$2" <<<"$(list "$1")" || true)
	[ -z "$hit" ] || fail "$1 holds what belongs elsewhere: $hit"
}
has moe-sidecar '/usr/s?bin/moe-sidecar'
has moe-sidecar '/usr/bin/moe-gen'
has moe-sidecar '(/usr)?/lib/systemd/system/moe-sidecar\.service'
has moe-sidecar '(/usr)?/lib/systemd/system/moe-sidecar\.socket'
has moe-sidecar '/usr/share/doc/moe-sidecar/operations\.md'
has moe-sidecar '/usr/share/man/man1/moe-sidecar\.1\.gz'
has moe-sidecar '/usr/share/man/man1/moe-gen\.1\.gz'
lacks moe-sidecar '\.(so(\.[0-9.]+)?|a|h|pc|cmake)$'
has libmoe-client1 '/usr/lib/([^/]+/)?libmoe_client\.so\.1'
has libmoe-client1 '/usr/lib/([^/]+/)?libmoe_client\.so\.1\.[0-9]+\.[0-9]+'
lacks libmoe-client1 '(\.so|\.a|\.h|\.pc|\.cmake|/bin/.*)$'
has libmoe-client-dev '/usr/include/moe_client\.h'
has libmoe-client-dev '/usr/include/moe_abi\.h'
has libmoe-client-dev '/usr/lib/([^/]+/)?libmoe_client\.a'
has libmoe-client-dev '/usr/lib/([^/]+/)?libmoe_client\.so'
has libmoe-client-dev '/usr/lib/([^/]+/)?pkgconfig/moe-client\.pc'
has libmoe-client-dev '/usr/lib/([^/]+/)?cmake/MoeClient/MoeClientConfig\.cmake'
lacks libmoe-client-dev '\.so\.[0-9]|/bin/|/systemd/'
for p in "${!deb[@]}"; do
	has "$p" "/usr/share/doc/$p/copyright"
	has "$p" "/usr/share/doc/$p/changelog\.Debian\.gz"
done
dupes=$(for p in "${!deb[@]}"; do list "$p" | grep -v '/$'; done | sort | uniq -d)
[ -z "$dupes" ] || fail "files in more than one package: $dupes"
dev_link=$(dpkg-deb -c "${deb[libmoe-client-dev]}" | awk '$6 ~ /libmoe_client\.so$/ {print $8}')
[ "$dev_link" = libmoe_client.so.1 ] || fail "libmoe-client-dev's libmoe_client.so -> '$dev_link', want libmoe_client.so.1"
ok "files: daemon, moe-gen, units, docs, manual pages | libmoe_client.so.1 | headers, .a, .so -> .so.1, .pc, CMake package"

# 4. Dependencies: every library the extracted binaries load comes from a package they depend
# on (what dpkg-shlibdeps computed, checked against dpkg -S here), and the -dev package pins
# the runtime one.
root=$work/root
for p in "${!deb[@]}"; do dpkg-deb -x "${deb[$p]}" "$root"; done
daemon=$root/usr/bin/moe-sidecar
[ -f "$daemon" ] || daemon=$root/usr/sbin/moe-sidecar
gen=$root/usr/bin/moe-gen
libdir=$(dirname "$(find "$root/usr/lib" -name 'libmoe_client.so.1' -print -quit)")
dep_names() { field "$1" Depends | tr ',' '\n' | sed -E 's/^ *//; s/[ (].*//; s/:.*//' | sort -u; }
owner() { # the package owning library path $1, /usr-merged or not ("?" if none)
	local real
	real=$(realpath "$1")
	for f in "$1" "$real"; do
		for g in "$f" "${f#/usr}" "/usr$f"; do
			dpkg -S "$g" 2>/dev/null | sed -E 's/:.*//; s/,.*//' | head -1 | grep . && return
		done
	done
	echo "?"
}
needs_packages() { # the packages owning the libraries ELF file $1 names (NEEDED; not theirs)
	local resolved
	resolved=$(LD_LIBRARY_PATH=$libdir ldd "$1")
	objdump -p "$1" | awk '$1 == "NEEDED" {print $2}' | while read -r name; do
		so=$(awk -v n="$name" '$1 == n && $2 == "=>" {print $3} $1 ~ "/" n "$" {print $1}' <<<"$resolved")
		case $so in
		"$root"/*) echo "(this project)" ;;
		/*) owner "$so" ;;
		*) echo "?: $name" ;;
		esac
	done | sed -E 's/:.*//' | sort -u
}
for pair in "moe-sidecar:$daemon" "moe-sidecar:$gen" "libmoe-client1:$libdir/libmoe_client.so.1"; do
	p=${pair%%:*} bin=${pair#*:}
	have=$(dep_names "$p")
	for want in $(needs_packages "$bin"); do
		[ "$want" != "(this project)" ] || fail "$p: ${bin##*/} loads a library of its own project"
		[ "$want" != "?" ] || fail "$bin needs a library no package owns: $(ldd "$bin")"
		grep -qx "$want" <<<"$have" || fail "$p: ${bin##*/} loads a library of $want, not in Depends: $(field "$p" Depends)"
	done
done
for want in liburing2 libhwloc15 libnuma1 $(ldd "$daemon" | grep -q libbpf && echo libbpf1); do
	grep -qx "$want" <<<"$(dep_names moe-sidecar)" || fail "moe-sidecar does not depend on $want: $(field moe-sidecar Depends)"
done
grep -qE "(^|, )libmoe-client1 \(= $deb_version\)(,|$)" <<<"$(field libmoe-client-dev Depends)" ||
	fail "libmoe-client-dev: Depends '$(field libmoe-client-dev Depends)' lacks libmoe-client1 (= $deb_version)"
grep -qE '^libmoe_client 1 libmoe-client1 ' <<<"$(dpkg-deb --ctrl-tarfile "${deb[libmoe-client1]}" | tar -xO ./shlibs)" ||
	fail "libmoe-client1 has no shlibs line for libmoe_client 1"
ok "Depends: moe-sidecar: $(field moe-sidecar Depends)"
ok "Depends: libmoe-client1: $(field libmoe-client1 Depends); libmoe-client-dev: $(field libmoe-client-dev Depends)"

# 5. lintian: warnings are reported, errors fail.
lintian --tag-display-limit 0 "${deb[@]}" >"$work/lintian.log" 2>&1 || true
sed 's/^/test_packages: lintian: /' "$work/lintian.log" | grep -v 'running with root privileges' || true
! grep -q '^E: ' "$work/lintian.log" || fail "lintian reports errors"
ok "lintian: no errors ($(grep -c '^W: ' "$work/lintian.log" || true) warnings)"

# 6. The extracted daemon and generator run, and the unit starts the packaged daemon.
out=$("$daemon" --version) || fail "$daemon --version"
grep -q "$version" <<<"$out" || fail "moe-sidecar --version says '$out', not $version"
out_gen=$("$gen" --version) || fail "$gen --version"
grep -q "$version" <<<"$out_gen" || fail "moe-gen --version says '$out_gen', not $version"
unit=$(find "$root" -name moe-sidecar.service | head -1)
exec_start=$(sed -nE 's/^ExecStart=([^ ]+).*/\1/p' "$unit")
[ -x "$root$exec_start" ] || fail "the unit's ExecStart=$exec_start is not in the package"
ok "extracted: ${out%%$'\n'*}; ${out_gen%%$'\n'*}; ExecStart=$exec_start"

# 7. A client built against the extracted -dev package: pkg-config and find_package.
export PKG_CONFIG_PATH=$libdir/pkgconfig
unset PKG_CONFIG_SYSROOT_DIR
cflags=$(pkg-config --cflags moe-client) libs=$(pkg-config --libs moe-client)
incdir=$(pkg-config --variable=includedir moe-client)
[ "$(realpath "$incdir")" = "$root/usr/include" ] ||
	fail "moe-client.pc's includedir $incdir is not the extracted $root/usr/include"
bin=$work/bin
mkdir -p "$bin"
# shellcheck disable=SC2086
"$cc" -std=c11 $cflags "$consumer/consumer.c" -o "$bin/pc_shared" $libs -lm ||
	fail "building consumer.c with pkg-config moe-client"
if ! cmake -S "$consumer" -B "$work/consumer-build" -DCMAKE_PREFIX_PATH="$root/usr" \
	-DCMAKE_C_COMPILER="$cc" >"$work/consumer.log" 2>&1 ||
	! cmake --build "$work/consumer-build" --target consumer_c_shared consumer_c_static \
		>>"$work/consumer.log" 2>&1; then
	cat "$work/consumer.log"
	fail "building consumer.c with find_package(MoeClient)"
fi
cp "$work/consumer-build/consumer_c_shared" "$work/consumer-build/consumer_c_static" "$bin/"
deps=$(LD_LIBRARY_PATH=$libdir ldd "$bin/pc_shared")
grep -q "libmoe_client.so.1 => $libdir/libmoe_client.so.1" <<<"$deps" ||
	fail "pc_shared does not load the extracted libmoe_client.so.1: $deps"
ok "built consumer.c: pkg-config (shared), find_package(MoeClient) (shared, static)"

# 8. Each runs a FORWARD against the extracted daemon, serving a model the extracted moe-gen made.
model=$work/model.gguf
"$gen" --preset qwen3-30b-a3b --layers 2 --experts 8 --hidden 256 --ffn 128 --format q8_0 \
	--seed 11 --out "$model" >"$work/gen.log" 2>&1 || { cat "$work/gen.log"; fail "moe-gen"; }
sock=$work/run/sidecar.sock
mkfifo "$work/ready"
"$daemon" serve "$model" --socket "$sock" --log-level warn --ready-fd 3 3>"$work/ready" \
	2>"$work/sidecar.log" &
sidecar_pid=$!
read -r -t 60 _ <"$work/ready" || { cat "$work/sidecar.log"; fail "the extracted daemon did not start"; }
for b in "$bin"/*; do
	out=$(LD_LIBRARY_PATH=$libdir "$b" "$sock" 2>&1) || fail "$(basename "$b"): $out"
	ok "$(basename "$b"): $out"
done
kill -TERM "$sidecar_pid"
wait "$sidecar_pid" || fail "the extracted daemon exited with status $?"
sidecar_pid=""
echo "test_packages: passed"
