#!/usr/bin/env bash
# test_units.sh BUILD SIDECAR — the installed moe-sidecar.service and .socket pass
# `systemd-analyze verify` without a word (it only warns, exit 0, on unknown keys and values,
# so any output fails), and the service is what the sidecar expects of it: Type=notify, a
# watchdog, socket-activated, only the probes' capabilities.
set -euo pipefail
build=$1 sidecar=$2
if ! command -v systemd-analyze >/dev/null; then
	echo "test_units: skipped: systemd-analyze is not installed (Debian package systemd)"
	exit 0
fi
work=$(mktemp -d /tmp/moe-test-units.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
	echo "test_units: FAIL: $*" >&2
	exit 1
}
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" ||
	{ cat "$work/install.log"; fail "cmake --install"; }
units=$work/prefix/lib/systemd/system
[ -x "$work/prefix/bin/moe-sidecar" ] || fail "the daemon is not installed (bin/moe-sidecar)"
for u in moe-sidecar.service moe-sidecar.socket; do
	[ -f "$units/$u" ] || fail "not installed: lib/systemd/system/$u"
done
mkdir "$work/check"
sed "s|^ExecStart=[^ ]*/moe-sidecar |ExecStart=$sidecar |" "$units/moe-sidecar.service" \
	>"$work/check/moe-sidecar.service"
cp "$units/moe-sidecar.socket" "$work/check/"
grep -q "^ExecStart=$sidecar serve " "$work/check/moe-sidecar.service" ||
	fail "ExecStart does not run moe-sidecar serve"
out=$(cd "$work/check" && systemd-analyze verify --man=no ./moe-sidecar.socket \
	./moe-sidecar.service 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify has remarks: $out"
svc=$work/check/moe-sidecar.service
for want in '^Type=notify$' '^WatchdogSec=' '^Requires=moe-sidecar.socket$' \
	'^CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_SYS_RESOURCE$' '^NoNewPrivileges=yes$' \
	'^LimitMEMLOCK=infinity$' '^Restart=on-failure$'; do
	grep -q "$want" "$svc" || fail "moe-sidecar.service lacks $want"
done
grep -q '^ListenStream=/run/moe-sidecar/sidecar.sock$' "$units/moe-sidecar.socket" ||
	fail "the socket unit does not listen on libmoe_client's default path"
echo "test_units: ok: both units verify cleanly; Type=notify, watchdog, socket-activated, 3 capabilities"
