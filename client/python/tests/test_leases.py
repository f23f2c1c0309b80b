"""Client.lease: zero-copy views of the sidecar's read-only slot pool (serve --leases), the
GGUF rows of each leased matrix equal to the model's weights, release on exit, views after
release refused, and a sidecar without --leases saying how to get leases."""
import os
import sys

import pytest

from conftest import REPO, Sidecar

sys.path.insert(0, os.path.join(REPO, "client", "python", "examples"))

torch = pytest.importorskip("torch")
import moe_sidecar  # noqa: E402
from engine_decode import read_safetensors  # noqa: E402


@pytest.fixture(scope="module")
def leasing(models):
    s = Sidecar(models["bf16"], "--leases")
    yield s
    assert s.stop() == 0


def expert_weight(tensors, layer, expert, name):
    for key, t in tensors.items():
        if f"layers.{layer}." in key and f"experts.{expert}.{name}_proj" in key:
            return t
    raise KeyError(f"layer {layer} expert {expert} {name}")


def test_leased_rows_are_the_models_weights(leasing, models):
    tensors = read_safetensors(models["bf16"])
    with moe_sidecar.Client(leasing.socket) as c:
        layer = c.moe_layers[0]
        with c.lease(layer) as lease:
            assert lease.experts == list(range(c.n_experts))
            views = lease.views()
            assert len(views) == c.n_experts and views[0]["gate"].dtype == torch.uint8
            for e in (0, 5, c.n_experts - 1):
                for name in ("gate", "up", "down"):
                    got = lease.rows(e, name)
                    want = expert_weight(tensors, layer, e, name)
                    assert got.dtype == torch.bfloat16
                    assert got.shape == want.shape, (name, got.shape, want.shape)
                    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
            st = c.stats()
            assert st["leases_held"] == c.n_experts
        assert lease.released
        assert c.stats()["leases_held"] == 0


def test_views_after_release_are_refused(leasing):
    with moe_sidecar.Client(leasing.socket) as c:
        lease = c.lease(c.moe_layers[-1], [1, 2])
        lease.views()
        lease.release()
        lease.release()  # idempotent
        with pytest.raises(moe_sidecar.InvalidError, match="released"):
            lease.views()
        with pytest.raises(moe_sidecar.InvalidError, match="released"):
            lease.rows(0, "gate")


def test_hostile_leases_are_refused(leasing):
    with moe_sidecar.Client(leasing.socket) as c:
        with pytest.raises(moe_sidecar.BadExpertError, match="out of range"):
            c.lease(c.moe_layers[0], [c.n_experts])
        with pytest.raises(moe_sidecar.BadExpertError, match="twice"):
            c.lease(c.moe_layers[0], [3, 3])
        with pytest.raises(ValueError):
            c.lease(c.moe_layers[0], [])
        with pytest.raises(ValueError, match="raw"):
            c.lease(c.moe_layers[0], [0], dtype="fp4")
        with pytest.raises(OverflowError):
            c.lease(c.moe_layers[0], [2**40])
        with pytest.raises(moe_sidecar.BadLayerError):
            c.lease(10_000, [0])
        with pytest.raises(moe_sidecar.LeaseRefusedError, match="pool 1: the sidecar shares 1 "):
            c.lease_pool(pool=1)
        with pytest.raises(OverflowError, match="pool"):
            c.lease_pool(pool=-1)
        with pytest.raises(OverflowError, match="pool"):
            c.lease_pool(pool=2**40)
        with pytest.raises(TypeError, match="pool"):
            c._ch.lease_pool(False, "0")
        assert len(c.lease_pool()) > 0
        assert c.stats()["leases_held"] == 0


def test_a_sidecar_without_leases_says_so(served_q8):
    with moe_sidecar.Client(served_q8.socket) as c:
        with pytest.raises(moe_sidecar.LeaseRefusedError, match="--leases"):
            c.lease(c.moe_layers[0], [0])


@pytest.mark.parametrize("fmt,dtype", [("bf16", "raw"), ("f16", "raw"), ("f32", "raw"),
                                       ("bf16", "bf16"), ("f32", "bf16")])
def test_engine_prefill_on_leased_experts_equals_the_sidecars(tmp_path, fmt, dtype):
    """engine_decode.py's --gpu-prefill-above path on the CPU: a prompt's MoE blocks computed
    by torch from leased experts give the tokens and final states of the sidecar's own
    prefill (fp32 activations, no deferral: within the sidecar's bf16 rounding), decode on
    the sidecar; every leased layer is timed and released."""
    import engine_decode as ed
    from conftest import generate

    model_dir = generate(str(tmp_path / f"m-{fmt}"), fmt=fmt, full=True)
    s = Sidecar(model_dir, "--leases", "--lease-staging-mib", "16")
    try:
        cfg = ed.Config(model_dir)
        tensors = ed.read_safetensors(model_dir)
        model = ed.Model(cfg, tensors, torch.device("cpu"), torch.float32)
        side = ed.SidecarMoE(model, model_dir, s.socket, 2, 0)
        client = next(iter(side.wrappers.values())).client
        prompt = [256, 72, 105, 33, 7, 99, 12, 300]
        want_toks, want_fin, want_logits = ed.decode(model, side, prompt, 3)[:3]
        leased = ed.LeasePrefillMoE(side, client, 2, dtype)
        toks, fin, logits = ed.decode(model, leased, prompt, 3)[:3]
        leased.check()
        assert toks == want_toks
        dmax, rel = ed.compare_finals(fin, want_fin)
        assert dmax <= ed.TOL_ABS and rel <= ed.TOL_REL, (dmax, rel)
        assert [t[0] for t in leased.timeline] == cfg.moe_layers
        st = client.stats()
        assert st["leases"] == len(cfg.moe_layers) * (cfg.n_experts - 2)
        assert st["leases_held"] == 0
    finally:
        assert s.stop() == 0


def test_bf16_leases_are_the_dequantized_rows(tmp_path):
    """dtype="bf16" on a Q8_0 model: zero-copy bfloat16 views of the channel's staging area,
    equal to the Q8_0 rows (fp16 scale, 32 int8 per block) dequantized here and rounded."""
    import numpy as np
    from conftest import generate

    model = generate(str(tmp_path / "q8.gguf"), fmt="q8_0")
    s = Sidecar(model, "--leases", "--lease-staging-mib", "8")
    try:
        with moe_sidecar.Client(s.socket) as c:
            layer = c.moe_layers[0]
            raw = c.lease(layer, [3, 4])
            with c.lease(layer, [3, 4], dtype="bf16") as bf:
                for i in range(2):
                    for name in ("gate", "up", "down"):
                        got = bf.views()[i][name]
                        assert got.dtype == torch.bfloat16
                        q = raw.rows(i, name).numpy()
                        rows, rb = q.shape
                        blocks = q.reshape(rows, rb // 34, 34)
                        d = blocks[:, :, :2].copy().view(np.float16).astype(np.float32)
                        w = blocks[:, :, 2:].view(np.int8).astype(np.float32) * d
                        want = torch.from_numpy(w.reshape(rows, -1)).to(torch.bfloat16)
                        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
            raw.release()
            with pytest.raises(moe_sidecar.InvalidError, match="released"):
                bf.views()
            assert c.stats()["leases_held"] == 0
    finally:
        assert s.stop() == 0


def test_leases_of_a_sidecar_split_over_numa_nodes(models):
    """A sidecar that splits each expert's rows over two (synthetic) NUMA nodes shares one
    pool per node (ABI 1.4): a raw lease's matrices come as slices (area 2), one per node's
    pool in row order; views() give a tensor per slice, rows() gathers the model's weights;
    the BF16 form is one matrix in the staging area, equal to the same weights."""
    s = Sidecar(models["bf16"], "--leases", "--lease-staging-mib", "8", "--threads", "2",
                "--numa", "synthetic:pack:1 numa:2 core:1 pu:1")
    try:
        tensors = read_safetensors(models["bf16"])
        with moe_sidecar.Client(s.socket) as c:
            layer = c.moe_layers[0]
            with c.lease(layer) as lease:
                views = lease.views()
                for e in (0, 7, c.n_experts - 1):
                    for name in ("gate", "up", "down"):
                        m = lease.matrices[e][name]
                        assert m["area"] == 2, m
                        assert [sl["pool"] for sl in m["slices"]] == [0, 1]
                        assert sum(sl["rows"] for sl in m["slices"]) == m["rows"]
                        assert len(views[e][name]) == 2
                        got = lease.rows(e, name)
                        want = expert_weight(tensors, layer, e, name)
                        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
            with c.lease(layer, [1, 2], dtype="bf16") as bf:
                for i, e in enumerate((1, 2)):
                    for name in ("gate", "up", "down"):
                        got = bf.views()[i][name]
                        want = expert_weight(tensors, layer, e, name)
                        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
            assert c.stats()["leases_held"] == 0
    finally:
        assert s.stop() == 0
