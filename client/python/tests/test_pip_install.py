"""`pip install ./client/python` into a fresh venv gives a moe_sidecar that attaches to a
running sidecar. Offline (this machine): --no-build-isolation --no-index, with the venv seeing
Debian's setuptools and wheel (--system-site-packages; python3-venv and python3-wheel from
scripts/deps.sh). With network, a plain `pip install ./client/python` fetches them itself."""

import os
import shutil
import subprocess

import pytest

from conftest import REPO


def test_pip_install_into_a_venv(tmp_path, served_bf16):
    venv = tmp_path / "venv"
    r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"no venv here (Debian's python3-venv): {r.stderr.strip()[-200:]}")
    py = str(venv / "bin" / "python")
    # From a copy of what the package builds from, so the build leaves nothing in the tree.
    src = tmp_path / "src"
    for d in ("client/python", "client/include", "proto"):
        shutil.copytree(os.path.join(REPO, d), src / d,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    for f in ("client.c", "placement.c", "client_internal.h"):
        shutil.copy(os.path.join(REPO, "client", f), src / "client" / f)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                        str(src / "client" / "python")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import moe_sidecar, sys; c = moe_sidecar.Client(sys.argv[1]); "
            "print(moe_sidecar.__file__); print(c.info['fingerprint']); c.close()")
    r = subprocess.run([py, "-c", code, served_bf16.socket], capture_output=True, text=True,
                       cwd=str(tmp_path), env={k: v for k, v in os.environ.items()
                                               if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr
    where, fp = r.stdout.split()
    assert where.startswith(str(venv)), f"imported from {where}, not the venv"
    assert len(fp) == 32
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # moe_sidecar alone never brings a kt_kernel: only the opt-in distribution does.
    r = subprocess.run([py, "-c", "import kt_kernel"], capture_output=True, text=True,
                       cwd=str(tmp_path), env=env)
    assert r.returncode != 0 and "No module named 'kt_kernel'" in r.stderr, r.stderr
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                        str(src / "client" / "python" / "kt_kernel_compat")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import kt_kernel, moe_sidecar; print(kt_kernel.__file__); "
            "print(kt_kernel.__version__); print(moe_sidecar.__version__)")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                       env=env)
    if r.returncode != 0 and "No module named 'torch'" in r.stderr:
        return  # kt_kernel is the engine's, and the engine brings torch; none here
    assert r.returncode == 0, r.stderr
    where, version, ms_version = r.stdout.split()
    assert where.startswith(str(venv)), f"imported from {where}, not the venv"
    assert version == ms_version + "+moe-sidecar"
