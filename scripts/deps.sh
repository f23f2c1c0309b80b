#!/usr/bin/env bash
# Installs the Debian packages moe-sidecar needs to build, test and benchmark — only those
# missing, so a second run costs nothing. Needs root or sudo for the install itself.
set -euo pipefail

pkgs=(
	build-essential cmake pkg-config git        # toolchain
	clang-format                                # the formatting check in scripts/test.sh
	liburing-dev libhwloc-dev libnuma-dev       # io_uring loader, topology, NUMA memory
	libbpf-dev bpftool clang llvm               # eBPF probes (CO-RE, skeletons)
	libclang-rt-dev                             # libFuzzer and clang sanitizer runtimes
	libcriterion-dev                            # tests
	libmicrohttpd-dev prometheus                # serve --metrics; promtool + server in tests
	gnuplot-nox                                 # plots of hit rates and latencies
	hwloc                                       # lstopo, synthetic topologies
	dpkg-dev file lintian                       # Debian packages: cpack -G DEB, their test
	ccache                                      # scripts/test.sh: the package build's objects
	python3-dev python3-numpy python3-torch     # the Python binding (client/python) and
	python3-pytest python3-venv python3-wheel   # its tests; Debian's /usr/bin/python3
)

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
	sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
