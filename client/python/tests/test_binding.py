"""moe_sidecar against a real sidecar, checked against a torch/numpy MoE block written here.

The reference reads the experts straight from the model files with numpy — BF16 safetensors
as bits, a Q8_0 GGUF dequantised in a few lines — and computes Σ w·down(silu(gate·x) ⊙ up·x)
in fp32. Tolerances are kt-kernel's accuracy measure, mean|out − ref| / mean|ref|: 0.02 for
BF16 weights (the sidecar rounds activations to bf16 once), 0.05 for Q8_0 (activations
quantised to 8 bits per block of 32), plus the output dtype's own rounding.
"""

import json
import os
import signal
import struct
import time

import numpy as np
import pytest

import moe_sidecar as ms

from conftest import Sidecar

torch = pytest.importorskip("torch")


# ---- reading the experts with numpy ------------------------------------------------------------

def _safetensors_tensors(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        base = 8 + n
        for key, t in header.items():
            if key != "__metadata__":
                out[key] = (path, base + t["data_offsets"][0], t["dtype"], t["shape"])
    return out


def _bf16_matrix(path, offset, shape):
    count = int(np.prod(shape))
    bits = np.fromfile(path, dtype=np.uint16, count=count, offset=offset)
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(shape)


class SafetensorsExperts:
    def __init__(self, directory):
        self.t = _safetensors_tensors(directory)

    def expert(self, layer, e):
        m = []
        for p in ("gate_proj", "up_proj", "down_proj"):
            path, off, dt, shape = self.t[f"model.layers.{layer}.mlp.experts.{e}.{p}.weight"]
            assert dt == "BF16"
            m.append(_bf16_matrix(path, off, shape))
        return m


def _gguf_tensors(path):
    """name -> (absolute offset, ggml type, ne) of a GGUF v3 file."""
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    assert data[:4] == b"GGUF"
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(t, pos):
        if t == 8:
            n = struct.unpack_from("<Q", data, pos)[0]
            return pos + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                pos = skip_value(et, pos)
            return pos
        return pos + sizes[t]

    alignment = 32
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", data, pos)[0]
        key = data[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        t = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", data, pos)[0]
        pos = skip_value(t, pos)
    infos = {}
    for _ in range(n_tensors):
        n = struct.unpack_from("<Q", data, pos)[0]
        name = data[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        nd = struct.unpack_from("<I", data, pos)[0]
        ne = struct.unpack_from(f"<{nd}Q", data, pos + 4)
        pos += 4 + 8 * nd
        typ, off = struct.unpack_from("<IQ", data, pos)
        pos += 12
        infos[name] = (off, typ, ne)
    start = (pos + alignment - 1) // alignment * alignment
    return {k: (start + off, typ, ne) for k, (off, typ, ne) in infos.items()}


class GGUFQ8Experts:
    def __init__(self, path):
        self.path = path
        self.t = _gguf_tensors(path)

    def _q8_0(self, name, e):
        off, typ, ne = self.t[name]
        assert typ == 8, f"{name}: type {typ}, want Q8_0"
        cols, rows = ne[0], ne[1]
        nblk = rows * cols // 32
        raw = np.fromfile(self.path, dtype=np.uint8, count=nblk * 34,
                          offset=off + e * nblk * 34).reshape(nblk, 34)
        d = raw[:, :2].copy().view(np.float16).astype(np.float32)
        q = raw[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, cols)

    def expert(self, layer, e):
        return [self._q8_0(f"blk.{layer}.ffn_{p}_exps.weight", e) for p in ("gate", "up", "down")]


def _silu(v):
    return v / (1.0 + np.exp(-v))


def reference_block(experts, layer, x, ids, w, skip=()):
    """Σ over each token's ids (not −1, not in skip) of w·down(silu(gate·x) ⊙ up·x), fp32."""
    x = np.asarray(x, np.float32)
    out = np.zeros_like(x)
    cache = {}
    for t in range(x.shape[0]):
        for e, wt in zip(ids[t], w[t]):
            e = int(e)
            if e < 0 or e in skip:
                continue
            if e not in cache:
                cache[e] = experts.expert(layer, e)
            g, u, d = cache[e]
            h = _silu(g @ x[t]) * (u @ x[t])
            out[t] += wt * (d @ h)
    return out


def rel_err(out, ref):
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.abs(out - ref).mean() / np.abs(ref).mean())


def routing(rng, n, n_experts, k):
    ids = np.stack([rng.choice(n_experts, size=k, replace=False) for _ in range(n)])
    w = rng.uniform(0.05, 1.0, size=(n, k)).astype(np.float32)
    w /= w.sum(axis=1, keepdims=True)
    return ids.astype(np.int64), w


def to_np(t):
    if isinstance(t, torch.Tensor):
        return t.float().numpy()
    return np.asarray(t, np.float32)


# ---- the MoE block through the binding ----------------------------------------------------

@pytest.fixture(scope="module")
def bf16(served_bf16, models):
    c = ms.Client(served_bf16.socket)
    yield c, SafetensorsExperts(models["bf16"])
    c.close()


@pytest.fixture(scope="module")
def q8(served_q8, models):
    c = ms.Client(served_q8.socket)
    yield c, GGUFQ8Experts(models["q8_0"])
    c.close()


@pytest.mark.parametrize("n", [1, 64])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_block_matches_the_torch_reference_bf16_weights(bf16, n, dtype):
    c, experts = bf16
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, c.hidden)).astype(np.float32)
    ids, w = routing(rng, n, c.n_experts, c.info["model_top_k"])
    xt = torch.from_numpy(x).to(getattr(torch, dtype))
    out = c.forward(1, xt, torch.from_numpy(ids), torch.from_numpy(w))
    assert isinstance(out, torch.Tensor) and out.dtype == xt.dtype and out.shape == xt.shape
    ref = reference_block(experts, 1, xt.float().numpy(), ids, w)
    assert rel_err(to_np(out), ref) < 0.02


@pytest.mark.parametrize("n", [1, 64])
def test_block_matches_the_numpy_reference_q8_0_gguf(q8, n):
    c, experts = q8
    rng = np.random.default_rng(100 + n)
    x = rng.standard_normal((n, c.hidden)).astype(np.float32)
    ids, w = routing(rng, n, c.n_experts, c.info["model_top_k"])
    out = c.forward(0, x, ids, w)  # numpy in, numpy out
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert rel_err(out, reference_block(experts, 0, x, ids, w)) < 0.05
    out16 = c.forward(0, x.astype(np.float16), ids, w)
    assert out16.dtype == np.float16
    assert rel_err(out16, reference_block(experts, 0, x, ids, w)) < 0.05


def test_skipped_ids_and_fewer_ids_than_top_k(bf16):
    c, experts = bf16
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, c.hidden)).astype(np.float32)
    ids, w = routing(rng, 5, c.n_experts, 3)  # k = 3 < top_k: row stride 3
    ids[1, 0] = ids[3, 2] = -1
    out = c.forward(2, x, ids, w)
    assert rel_err(out, reference_block(experts, 2, x, ids, w)) < 0.02


def test_deferral_arrives_in_the_next_layer(bf16):
    """kt-kernel's semantics over several layers: each token's k_defer lowest-weighted experts
    of layer L are added to layer L+1's output; the last layer defers nothing."""
    c, experts = bf16
    layers = c.moe_layers
    rng = np.random.default_rng(11)
    n, k = 3, c.info["model_top_k"]
    owed = None
    for i, layer in enumerate(layers):
        x = rng.standard_normal((n, c.hidden)).astype(np.float32)
        ids, w = routing(rng, n, c.n_experts, k)
        k_defer = 0 if i == len(layers) - 1 else 1
        out = c.forward(layer, x, ids, w, k_defer=k_defer)
        lowest = np.argsort(w, axis=1, kind="stable")[:, :k_defer]
        deferred = np.zeros_like(ids, dtype=bool)
        np.put_along_axis(deferred, lowest, True, axis=1)
        imm = reference_block(experts, layer, x, np.where(deferred, -1, ids), w)
        ref = imm + (owed if owed is not None else 0)
        assert c.last_deferred == n * k_defer
        assert rel_err(out, ref) < 0.02, f"layer {layer}"
        owed = reference_block(experts, layer, x, np.where(deferred, ids, -1), w)


def test_async_pair_and_zero_copy_views(bf16):
    c, experts = bf16
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((2, c.hidden)).astype(np.float32) for _ in range(3)]
    routes = [routing(rng, 2, c.n_experts, 4) for _ in range(3)]
    pending = [c.forward_submit(1, x, i, w) for x, (i, w) in zip(xs, routes)]
    for p, x, (i, w) in reversed(list(zip(pending, xs, routes))):
        assert rel_err(p.wait(), reference_block(experts, 1, x, i, w)) < 0.02
    # A slot's areas are views of the shared mapping: what is written is what the sidecar
    # reads, and its output is readable in place.
    v = c.slot(0)
    assert v.input().size * 4 == v.layout["input"][1]
    assert v.input(torch=True).data_ptr() == c.region()[0] + v.layout["input"][0]
    del v


def test_close_refuses_while_a_torch_or_numpy_slot_view_lives(served_bf16):
    """A view keeps its Area, and close() refuses while any Area lives: a torch tensor made
    by torch.frombuffer holds the Area but not a buffer export, so counting exports let
    close() unmap the memory under it (touching it then was a SIGSEGV)."""
    c = ms.Client(served_bf16.socket)
    t = c.slot(0).output(torch=True)
    t[:4] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(BufferError, match="slot views"):
        c.close()
    assert not c.closed
    assert t[:4].tolist() == [1.0, 2.0, 3.0, 4.0]  # still mapped
    del t
    a = c.slot(1).expert_ids()
    with pytest.raises(BufferError, match="slot views"):
        c.close()
    del a
    c.close()
    assert c.closed


def test_gpu_mask_and_masked_experts(bf16):
    c, experts = bf16
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, c.hidden)).astype(np.float32)
    ids, w = routing(rng, 2, c.n_experts, 4)
    mask = [e == int(ids[0, 0]) for e in range(c.n_experts)]
    c.set_gpu_mask(mask, layer=1)
    with pytest.raises(ms.MaskedError) as ei:
        c.forward(1, x, ids, w)
    assert ei.value.value == int(ids[0, 0]) and "GPU" in ei.value.status_name
    c.set_gpu_mask([[False] * c.n_experts] * c.info["n_layers"])
    c.forward(1, x, ids, w)
    with pytest.raises(ValueError, match="row 0 has 3 entries"):
        c.set_gpu_mask([True, False, True], layer=1)


def test_errors_carry_the_sidecars_sentence(bf16):
    c, _ = bf16
    x = np.zeros((1, c.hidden), np.float32)
    with pytest.raises(ms.BadExpertError) as ei:
        c.forward(0, x, np.array([[0, 999]]), np.array([[0.5, 0.5]], np.float32))
    e = ei.value
    assert e.value == 999 and e.index == 1 and "expert 999 out of range" in e.message
    with pytest.raises(ms.BadExpertError) as ei:
        c.forward(0, x, np.array([[0, -5]]), np.array([[0.5, 0.5]], np.float32))
    assert ei.value.value == -5
    last = c.moe_layers[-1]
    with pytest.raises(ms.BadFieldError, match="last MoE layer"):
        c.forward(last, x, np.array([[0, 1]]), np.array([[0.5, 0.5]], np.float32), k_defer=1)
    with pytest.raises(ms.BadWeightError):
        c.forward(0, x, np.array([[0, 1]]), np.array([[0.5, np.nan]], np.float32))


def test_bad_arguments_name_the_argument(bf16):
    c, _ = bf16
    x = np.zeros((2, c.hidden), np.float32)
    ids = np.zeros((2, 2), np.int32)
    w = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="hidden"):
        c.forward(0, np.zeros((2, c.hidden + 1), np.float32), ids, w)
    with pytest.raises(ValueError, match="hidden"):
        c.forward(0, x.astype(np.int32), ids, w)
    with pytest.raises(ValueError, match="ids"):
        c.forward(0, x, np.zeros((3, 2), np.int32), w)
    with pytest.raises(ValueError, match="ids"):
        c.forward(0, x, ids.astype(np.float32), w)
    with pytest.raises(ValueError, match="weights"):
        c.forward(0, x, ids, np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="layer"):
        c.forward(99, x, ids, w)
    with pytest.raises(ValueError, match="k_defer"):
        c.forward(0, x, ids, w, k_defer=3)


def test_stats_and_fingerprint(bf16, models):
    c, _ = bf16
    st = c.stats()
    assert st["fingerprint"] == c.fingerprint == ms.fingerprint(models["bf16"])
    assert st["requests"] > 0
    assert ms.fingerprint(models["other"]) != c.fingerprint


def test_prefetch(bf16):
    c, _ = bf16
    assert c.prefetch(1, ids=[0, 1], scores=[1.0, 0.5]) >= 0
    with pytest.raises(ms.BadExpertError):
        c.prefetch(1, ids=[0, 1000], scores=[1.0, 0.5])


# ---- the kt-kernel wrapper ---------------------------------------------------------------

def test_wrapper_cpu_matches_reference_with_gpu_experts_and_deferral(served_bf16, models):
    c = ms.Client(served_bf16.socket)
    info = c.info
    c.close()
    experts = SafetensorsExperts(models["bf16"])
    layers = info["moe_layers"]
    n_gpu = 4
    wrappers = [ms.KTMoEWrapper(layer_idx=l, num_experts=info["n_experts"],
                                num_experts_per_tok=info["model_top_k"],
                                hidden_size=info["model_hidden"],
                                moe_intermediate_size=info["expert_ffn"], num_gpu_experts=n_gpu,
                                cpuinfer_threads=2, threadpool_count=1,
                                weight_path=models["bf16"], chunked_prefill_size=512,
                                max_deferred_experts_per_token=1, method="BF16",
                                socket=served_bf16.socket)
                for l in layers]
    for wr in wrappers:
        wr.load_weights()
    rng = np.random.default_rng(21)
    n, k = 2, info["model_top_k"]
    owed = 0
    for i, (layer, wr) in enumerate(zip(layers, wrappers)):
        x = torch.from_numpy(rng.standard_normal((n, info["hidden"])).astype(np.float32))
        ids, w = routing(rng, n, info["n_experts"], k)
        out = wr.forward(x.bfloat16(), torch.from_numpy(ids), torch.from_numpy(w))
        assert out.dtype == torch.bfloat16 and out.shape == (n, info["hidden"])
        cpu = np.where(ids < n_gpu, -1, ids)  # the GPU experts are the engine's
        k_defer = 0 if i == len(layers) - 1 else 1
        wcpu = np.where(cpu < 0, np.inf, w)
        lowest = np.argsort(wcpu, axis=1, kind="stable")[:, :k_defer]
        deferred = np.zeros_like(ids, dtype=bool)
        np.put_along_axis(deferred, lowest, True, axis=1)
        deferred &= cpu >= 0
        xb = x.bfloat16().float().numpy()
        ref = reference_block(experts, layer, xb, np.where(deferred, -1, cpu), w) + owed
        assert rel_err(out.float().numpy(), ref) < 0.02, f"layer {layer}"
        owed = reference_block(experts, layer, xb, np.where(deferred, cpu, -1), w)


def test_wrapper_prefill_bigger_than_a_request_is_chunked(served_bf16, models):
    c = ms.Client(served_bf16.socket)
    info = c.info
    c.close()
    experts = SafetensorsExperts(models["bf16"])
    wr = ms.KTMoEWrapper(1, info["n_experts"], info["model_top_k"], info["model_hidden"],
                         info["expert_ffn"], socket=served_bf16.socket)
    n = info["max_tokens"] + 3
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, info["hidden"])).astype(np.float32)
    ids, w = routing(rng, n, info["n_experts"], 2)
    out = wr.forward(torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(w))
    assert out.shape == (n, info["hidden"])
    assert rel_err(out.numpy(), reference_block(experts, 1, x, ids, w)) < 0.02


def test_wrapper_asks_for_its_chunked_prefill_size_up_to_serve_max_tokens(models):
    """KTMoEWrapper(chunked_prefill_size=C) sizes its channel for C tokens, capped at serve
    --max-tokens without failing; without C (or SGLang's -1) the default, 256. A prefill chunk
    above 256 but within the channel is one FORWARD (it was split into 256-token ones)."""
    s = Sidecar(models["bf16"], "--max-tokens", "1024")
    try:
        c = ms.Client(s.socket)
        info = c.info
        c.close()
        dims = (1, info["n_experts"], info["model_top_k"], info["model_hidden"],
                info["expert_ffn"])
        for chunk, want in ((512, 512), (4096, 1024), (None, 256), (-1, 256)):
            wr = ms.KTMoEWrapper(*dims, chunked_prefill_size=chunk, socket=s.socket)
            assert wr.client.max_tokens == want, f"chunked_prefill_size={chunk}"
            if chunk == 4096:
                experts = SafetensorsExperts(models["bf16"])
                n = 700
                rng = np.random.default_rng(5)
                x = rng.standard_normal((n, info["hidden"])).astype(np.float32)
                ids, w = routing(rng, n, info["n_experts"], 2)
                before = wr.client.stats()["requests"]
                out = wr.forward(torch.from_numpy(x), torch.from_numpy(ids),
                                 torch.from_numpy(w))
                assert wr.client.stats()["requests"] - before == 1
                assert rel_err(out.numpy(), reference_block(experts, 1, x, ids, w)) < 0.02
            wr.client.close()  # the next wrapper opens the process's channel anew
    finally:
        assert s.stop() == 0


def test_wrapper_refuses_another_model_and_other_shapes(served_bf16, models):
    c = ms.Client(served_bf16.socket)
    info = c.info
    c.close()
    args = (1, info["n_experts"], info["model_top_k"], info["model_hidden"], info["expert_ffn"])
    wr = ms.KTMoEWrapper(*args, weight_path=models["other"], socket=served_bf16.socket)
    with pytest.raises(ms.RefusedError, match="weight_path"):
        wr.load_weights()
    with pytest.raises(ValueError, match="hidden_size"):
        ms.KTMoEWrapper(1, info["n_experts"], info["model_top_k"], info["model_hidden"] * 2,
                        info["expert_ffn"], socket=served_bf16.socket)
    with pytest.raises(ValueError, match="layer_idx"):
        ms.KTMoEWrapper(99, *args[1:], socket=served_bf16.socket)
    with pytest.raises(ms.RefusedError, match="expects"):
        ms.Client(served_bf16.socket, model_path=models["other"])


def test_wrapper_tp_rank_other_than_0_returns_zeros(served_bf16):
    wr = ms.KTMoEWrapper(1, 16, 8, 256, 128, socket=served_bf16.socket, tp_rank=1)
    x = torch.ones(2, 256, dtype=torch.bfloat16)
    out = wr.forward(x, torch.zeros(2, 8, dtype=torch.int64), torch.ones(2, 8))
    assert out.dtype == x.dtype and not out.any()


# ---- a sidecar that dies ------------------------------------------------------------------

def test_a_sidecar_killed_mid_call_raises_within_the_timeout(models):
    s = Sidecar(models["q8_0"])
    try:
        c = ms.Client(s.socket, timeout_ms=20000, connect_timeout_ms=0)
        x = np.zeros((1, c.hidden), np.float32)
        ids, w = np.array([[0, 1]]), np.array([[0.5, 0.5]], np.float32)
        c.forward(0, x, ids, w)
        os.kill(s.proc.pid, signal.SIGSTOP)
        os.waitpid(s.proc.pid, os.WUNTRACED)  # stopped: it completes nothing more
        p = c.forward_submit(0, x, ids, w)
        os.kill(s.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ms.PeerDeadError):
            p.wait()
        assert time.monotonic() - t0 < 10, "seen at the hang-up, long before the timeout"
        # The next call reconnects first; nothing serves the socket (test_restart.py has
        # the restarts).
        with pytest.raises(ms.ConnectError, match="is moe-sidecar serve running"):
            c.forward(0, x, ids, w)
        c.close()
    finally:
        s.stop(signal.SIGKILL)


def test_connecting_to_nothing_says_so(tmp_path):
    with pytest.raises(ms.ConnectError, match="is moe-sidecar serve running"):
        ms.Client(str(tmp_path / "none.sock"))


def test_connect_timeout_zero_fails_at_once_and_a_wait_succeeds(tmp_path, models):
    """connect_timeout_ms=0 does not wait: nothing at the path is ConnectError. A client whose
    connect starts before the sidecar exists connects once it serves (C's wait, moe_connect)."""
    import threading

    sock = str(tmp_path / "run" / "s.sock")
    with pytest.raises(ms.ConnectError) as e:
        ms.Client(sock, connect_timeout_ms=0)
    assert not isinstance(e.value, ms.StartingError)
    assert "is moe-sidecar serve running?" in str(e.value)
    got = {}
    started = threading.Event()

    def connect():
        started.set()
        try:
            got["client"] = ms.Client(sock, connect_timeout_ms=60000)
        except Exception as exc:  # reported below
            got["error"] = exc

    t = threading.Thread(target=connect)
    t.start()
    started.wait()
    sidecar = Sidecar(models["q8_0"], socket=sock)
    t.join()
    assert "error" not in got, got.get("error")
    got["client"].ping()
    got["client"].close()
    assert sidecar.stop() == 0


# ---- batch invariance ---------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["served_bf16", "served_q8"])
def test_batch_invariant_channel_gives_a_token_the_same_bits(fixture, request):
    """Client(batch_invariant=True): a token alone and inside batches of random tokens at a
    random position comes back with the same bits; a plain channel beside it is not one."""
    served = request.getfixturevalue(fixture)
    plain = ms.Client(served.socket)
    c = ms.Client(served.socket, batch_invariant=True)
    try:
        assert c.batch_invariant and not plain.batch_invariant
        assert c.stats()["batch_invariant"] == {"serve": False, "channel": True, "channels": 1}
        rng = np.random.default_rng(11)
        k = c.info["model_top_k"]
        x0 = rng.standard_normal((1, c.hidden)).astype(np.float32)
        ids0, w0 = routing(rng, 1, c.n_experts, k)
        layer = c.moe_layers[0]
        alone = c.forward(layer, x0, ids0, w0)
        for n in (2, 8, 9, 64):
            x = rng.standard_normal((n, c.hidden)).astype(np.float32)
            ids, w = routing(rng, n, c.n_experts, k)
            at = int(rng.integers(n))
            x[at], ids[at], w[at] = x0[0], ids0[0], w0[0]
            out = c.forward(layer, x, ids, w)
            assert out[at].tobytes() == alone[0].tobytes(), f"token at {at} of {n}"
    finally:
        c.close()
        plain.close()
