"""Fixtures for the moe_sidecar tests: models made with the project's generator, real
`moe-sidecar serve` processes started with --ready-fd (no sleeping), and the build's
moe_sidecar package on sys.path.

MOE_BUILD_DIR names the build (default: the repository's build/).
"""

import os
import signal
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BUILD = os.environ.get("MOE_BUILD_DIR", os.path.join(REPO, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))

GEN = os.path.join(BUILD, "tools", "moe-gen")
SIDECAR = os.path.join(BUILD, "sidecar", "moe-sidecar")


def generate(out, preset="qwen3-30b-a3b", fmt="bf16", layers=4, experts=16, hidden=256,
             ffn=128, seed=7, full=False):
    """A model from moe-gen: a safetensors directory (out without .gguf) or a GGUF file."""
    args = [GEN, "--preset", preset, "--layers", str(layers), "--experts", str(experts),
            "--hidden", str(hidden), "--ffn", str(ffn), "--format", fmt, "--seed", str(seed),
            "--out", out]
    if full:
        args.append("--full-model")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return out


class Sidecar:
    """A running `moe-sidecar serve MODEL`; stop() ends it (SIGTERM; asserts exit 0).
    user: another uid to run it as (needs root; the model must be readable by it).
    socket: the socket path (default: run/sidecar.sock in a directory of its own)."""

    def __init__(self, model, *extra, user=None, socket=None):
        self.dir = tempfile.mkdtemp(prefix="moe-py-")
        as_user = {}
        if user is not None:
            os.chown(self.dir, user, user)
            as_user = dict(user=user, group=user, extra_groups=[])
        self.socket = socket or os.path.join(self.dir, "run", "sidecar.sock")
        self.log_path = os.path.join(self.dir, "sidecar.log")
        r, w = os.pipe()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [SIDECAR, "serve", model, "--socket", self.socket, "--ready-fd", str(w),
                 "--probes-instance", f"pytest-{os.getpid()}-{id(self)}", *extra],
                pass_fds=(w,), stdout=log, stderr=subprocess.STDOUT, **as_user)
        os.close(w)
        with os.fdopen(r) as ready:
            line = ready.readline()
        if not line.startswith("READY"):
            self.proc.wait(10)
            raise RuntimeError(f"sidecar did not start: {self.log()}")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        subprocess.run(["rm", "-rf", self.dir], check=False)
        return rc


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Two models of one Qwen3 shape: BF16 safetensors (whole model) and Q8_0 GGUF, and a
    third, same shape as the first with other weights."""
    d = tmp_path_factory.mktemp("models")
    return {
        "bf16": generate(str(d / "bf16"), fmt="bf16", full=True),
        "q8_0": generate(str(d / "q8_0.gguf"), fmt="q8_0"),
        "other": generate(str(d / "other"), fmt="bf16", seed=8, full=True),
    }


@pytest.fixture(scope="session")
def served_bf16(models):
    s = Sidecar(models["bf16"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def served_q8(models):
    s = Sidecar(models["q8_0"])
    yield s
    assert s.stop() == 0
