"""kt_kernel, moe-sidecar's stand-in for kt-kernel, driven the way SGLang's MoE layer drives
kt-kernel: imported by the name kt_kernel, one wrapper per MoE layer built with SGLang's
keywords, masks from generate_gpu_experts_masks, submit_forward / GPU experts / sync_forward
per layer, deferral on, a mask update mid-run (SGLang's dynamic expert update), the engine's
own deferral selector, a sidecar killed and restarted mid-run, and TP ranks each owning a
share of the CPU experts. The GPU experts are a torch stand-in on the CPU (the CUDA stream
path is test_cuda.py's; this file needs no GPU).

The reference is all-torch fp32 over the same (bf16-stored) weights, with kt-kernel's
deferral written out here: per token, the protected_k = top_k - max_deferred highest-weighted
entries are protected, an expert protected for any token is computed at once for every token,
every other CPU entry is added to the next MoE layer's output; the last layer defers nothing.
"""

import importlib.util
import logging
import os
import signal
import subprocess
import sys

import pytest

from conftest import BUILD, REPO, Sidecar, generate

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(BUILD, "python-kt"))  # kt_kernel only where asked for

import moe_sidecar as ms  # noqa: E402

TOL = 2e-2  # bf16 activations: kt-kernel's own bound (docs/engines.md, accuracy)


def _example():
    path = os.path.join(REPO, "client", "python", "examples", "engine_decode.py")
    spec = importlib.util.spec_from_file_location("engine_decode", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("kt")
    path = generate(str(d / "m"), fmt="bf16", full=True, layers=4, experts=16)
    ex = _example()
    tensors = ex.read_safetensors(path)
    import json

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    E = cfg["num_experts"]
    experts = {}
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}.mlp.experts."
        if f"{p}0.gate_proj.weight" in tensors:
            experts[L] = tuple(torch.stack([tensors[f"{p}{e}.{proj}_proj.weight"]
                                            for e in range(E)]).float()
                               for proj in ("gate", "up", "down"))
    return {"path": path, "cfg": cfg, "experts": experts, "swiglu": ex.swiglu_experts}


@pytest.fixture
def served(model, tmp_path, monkeypatch):
    sock = str(tmp_path / "run" / "s.sock")
    s = Sidecar(model["path"], socket=sock)
    monkeypatch.setenv("MOE_SIDECAR_SOCKET", sock)
    yield s
    s.stop(signal.SIGKILL)


def _kt():
    import kt_kernel

    return kt_kernel


# ---- the reference -------------------------------------------------------------------------

def _kt_split(ids, w, protected_k, E):
    """kt-kernel's deferral rule, as documented: (immediate, deferred) bool masks over ids."""
    top = torch.topk(w, k=protected_k, dim=1).indices
    prot = torch.zeros(E, dtype=torch.bool)
    prot[torch.gather(ids, 1, top).reshape(-1)] = True
    now = prot[ids]
    return now, ~now


class Reference:
    """All-torch fp32 MoE layers with kt's deferral; gpu[L] (bool [E]) says which experts
    the GPU computes (never deferred: kt defers only the CPU's). selector: the engine's
    (immediate, deferred) rule over the full ids, or kt's."""

    def __init__(self, model, k_defer, selector=None):
        self.m, self.k_defer, self.owed, self.selector = model, k_defer, None, selector

    def layer(self, L, x, ids, w, gpu, last):
        E = self.m["cfg"]["num_experts"]
        k = ids.shape[1]
        y = self.m["swiglu"](x.float(), *self.m["experts"][L])  # [E, n, H]
        on_gpu = gpu[ids]
        later = torch.zeros_like(on_gpu)
        if self.k_defer and not last:
            if self.selector:
                _, d = self.selector(ids, w, k - self.k_defer)
                later = d >= 0
            else:
                later = _kt_split(ids, w, k - self.k_defer, E)[1]
            later &= ~on_gpu
        coef = lambda sel: torch.zeros(ids.shape[0], E).scatter_add_(  # noqa: E731
            1, ids, torch.where(sel, w, torch.zeros_like(w)))
        out = torch.einsum("ne,enh->nh", coef(~later), y)
        if self.owed is not None:
            out = out + self.owed
        self.owed = torch.einsum("ne,enh->nh", coef(later), y) if later.any() else None
        return out


# ---- the engine stand-in ---------------------------------------------------------------------

def _gpu_part(model, L, x, ids, w, gpu):
    """SGLang's GPU half: the experts in the layer's mask, CPU ids masked out (torch, fp32)."""
    E = model["cfg"]["num_experts"]
    sel = gpu[ids]
    coef = torch.zeros(ids.shape[0], E).scatter_add_(1, ids, torch.where(sel, w,
                                                                         torch.zeros_like(w)))
    y = model["swiglu"](x.float(), *model["experts"][L])
    return torch.einsum("ne,enh->nh", coef, y).to(x.dtype)


def _inputs(model, layers, n, seed):
    g = torch.Generator().manual_seed(seed)
    cfg = model["cfg"]
    out = []
    for _ in layers:
        x = torch.randn(n, cfg["hidden_size"], generator=g).to(torch.bfloat16)
        logits = torch.randn(n, cfg["num_experts"], generator=g)
        w, ids = torch.topk(torch.softmax(logits, -1), cfg["num_experts_per_tok"], dim=-1)
        out.append((x, ids, w))
    return out


def _wrappers(model, masks, k_defer, chunk=8192, **extra):
    kt = _kt()
    cfg = model["cfg"]
    layers = sorted(model["experts"])
    ws = []
    for i, L in enumerate(layers):
        w = kt.KTMoEWrapper(
            layer_idx=L, num_experts=cfg["num_experts"],
            num_experts_per_tok=cfg["num_experts_per_tok"], hidden_size=cfg["hidden_size"],
            moe_intermediate_size=cfg["moe_intermediate_size"], gpu_experts_mask=masks[i],
            cpuinfer_threads=8, threadpool_count=1, numa_nodes=None,
            weight_path=model["path"], chunked_prefill_size=chunk, method="BF16",
            max_deferred_experts_per_token=0 if i == len(layers) - 1 else k_defer,
            swiglu_limit=0.0, swiglu_alpha=0.0, **extra)
        w.load_weights(torch.arange(cfg["num_experts"]))
        ws.append(w)
    return ws


def _step(model, wrappers, inputs, masks):
    """One forward pass over the MoE layers as SGLang's KTEPWrapperMethod.apply runs it."""
    outs = []
    for wr, (x, ids, w), gpu in zip(wrappers, inputs, masks):
        wr.submit_forward(x, ids, w, 0)
        gpu_out = _gpu_part(model, wr.layer_idx, x, ids, w, gpu)
        outs.append(gpu_out + wr.sync_forward(x, 0))
    return outs


def _reference(model, ref, inputs, masks):
    layers = sorted(model["experts"])
    return [ref.layer(L, x, ids, w, gpu, i == len(layers) - 1)
            for i, (L, (x, ids, w), gpu) in enumerate(zip(layers, inputs, masks))]


def _rel(a, b):
    return float((a.float() - b).abs().max() / b.abs().max())


def _assert_close(outs, refs):
    errs = [_rel(o, r) for o, r in zip(outs, refs)]
    assert max(errs) < TOL, errs
    return errs


# ---- tests ------------------------------------------------------------------------------------

def test_imported_by_name_it_says_whose_it_is():
    kt = _kt()
    assert kt.__version__ == ms.__version__ + "+moe-sidecar"
    assert {"KTMoEWrapper", "generate_gpu_experts_masks"} <= set(kt.__all__)
    assert issubclass(kt.KTMoEWrapper, ms.KTMoEWrapper)


def test_masks_are_kts_on_its_documented_example():
    gen = _kt().generate_gpu_experts_masks
    freq = torch.tensor([[0.1, 0.5, 0.3, 0.8], [0.2, 0.4, 0.9, 0.1]])
    m = gen(freq, num_gpu_experts=3)
    assert m.dtype == torch.bool and m.tolist() == [[False, True, False, True],
                                                    [False, False, True, False]]
    assert not gen(freq, 0).any() and gen(freq, 99).all()  # the budget is clamped, as kt's
    # moe-sidecar's strategies over the same input
    assert gen(freq, 2, strategy="uniform").tolist() == [[False, False, False, True],
                                                         [False, False, True, False]]
    assert gen(freq, 4, strategy="front-loading").tolist() == [[True] * 4, [False] * 4]
    for s in ("frequency", "uniform", "front-loading", "balanced"):
        assert int(gen(freq, 3, strategy=s).sum()) == 3
        if s != "frequency":
            want = ms.placement(freq.double(), 3, s)["gpu_experts_mask"]
            assert gen(freq, 3, strategy=s).tolist() == want
    with pytest.raises(ValueError, match="strategy"):
        gen(freq, 3, strategy="random")


def test_keywords_without_meaning_are_logged_once_and_swiglu_is_checked(model, served,
                                                                           caplog):
    kt = _kt()
    import kt_kernel.experts as kte

    kte._reported.clear()
    masks = torch.zeros(4, 16, dtype=torch.bool)
    with caplog.at_level(logging.WARNING, logger="kt_kernel"):
        ws = _wrappers(model, masks, 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "kt_kernel"]
    assert len(lines) == 1, lines
    for k in ("cpuinfer_threads=8", "threadpool_count=1", "method='BF16'"):
        assert k in lines[0]
    # chunked_prefill_size sizes the channel: 8192 asked, capped at serve --max-tokens (256).
    assert "chunked_prefill_size" not in lines[0]
    assert ws[0].client.max_tokens == 256
    cfg = model["cfg"]
    dims = dict(layer_idx=0, num_experts=16, num_experts_per_tok=cfg["num_experts_per_tok"],
                hidden_size=cfg["hidden_size"],
                moe_intermediate_size=cfg["moe_intermediate_size"])
    with pytest.raises(ValueError, match=r"swiglu_limit=7.0, but .* plain SwiGLU"):
        kt.KTMoEWrapper(**dims, gpu_experts_mask=None, swiglu_limit=7.0)
    with pytest.raises(ValueError, match=r"swiglu_alpha=1.702, but .* plain SwiGLU"):
        kt.KTMoEWrapper(**dims, gpu_experts_mask=None, swiglu_limit=0.0, swiglu_alpha=1.702)
    w = kt.KTMoEWrapper(**dims, num_gpu_experts=3)  # kt's older keyword: the first three
    assert w.gpu_experts_mask.tolist() == [True] * 3 + [False] * 13
    with pytest.raises(ValueError, match="redundant"):
        w.load_weights(torch.tensor([0, 0] + list(range(2, 16))))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here (CI has none): the stream path runs on a GPU "
                           "machine")
def test_sglang_kt_path_on_cuda_streams_matches_the_all_torch_reference(model, served):
    """The same steps on CUDA tensors, as SGLang runs them: submit_forward / sync_forward on
    the current stream, deferral on (kt's rule, applied by the sidecar on the stream path),
    then a mask update in place."""
    kt = _kt()
    layers = sorted(model["experts"])
    E = model["cfg"]["num_experts"]
    g = torch.Generator().manual_seed(2)
    masks = kt.generate_gpu_experts_masks(torch.rand(len(layers), E, generator=g), 12)
    wrappers = _wrappers(model, masks, k_defer=2)
    ref = Reference(model, 2)

    def cuda_step(inputs):
        stream = torch.cuda.current_stream().cuda_stream
        outs = []
        for wr, (x, ids, w), gpu in zip(wrappers, inputs, masks):
            xc, ic, wc = x.cuda(), ids.cuda(), w.cuda()
            wr.submit_forward(xc, ic, wc, stream)
            gpu_out = _gpu_part(model, wr.layer_idx, x, ids, w, gpu)
            outs.append(gpu_out + wr.sync_forward(xc, stream).cpu())
        return outs

    for step in range(2):
        inputs = _inputs(model, layers, 5, 20 + step)
        _assert_close(cuda_step(inputs), _reference(model, ref, inputs, masks))
    masks = kt.generate_gpu_experts_masks(torch.rand(len(layers), E, generator=g), 12,
                                          strategy="uniform")
    for wr, m in zip(wrappers, masks):
        wr.gpu_experts_mask.copy_(m)
    inputs = _inputs(model, layers, 5, 22)
    _assert_close(cuda_step(inputs), _reference(model, ref, inputs, masks))


def test_chunked_prefill_size_is_asked_for_up_to_serve_max_tokens(model, tmp_path,
                                                                    monkeypatch):
    """SGLang's chunked_prefill_size reaches the channel: a sidecar serving --max-tokens 1024
    grants wrappers of chunked_prefill_size=8192 1024-token requests (256 before: raising
    --max-tokens did nothing on the kt path), and 512 to wrappers of 512."""
    sock = str(tmp_path / "run" / "s.sock")
    s = Sidecar(model["path"], "--max-tokens", "1024", socket=sock)
    monkeypatch.setenv("MOE_SIDECAR_SOCKET", sock)
    try:
        masks = torch.zeros(4, 16, dtype=torch.bool)
        ws = _wrappers(model, masks, 1)
        assert [w.client.max_tokens for w in ws] == [1024] * len(ws)
        ws[0].client.close()
        ws = _wrappers(model, masks, 1, chunk=512)
        assert ws[0].client.max_tokens == 512
    finally:
        s.stop(signal.SIGKILL)


def test_sglang_kt_path_matches_the_all_torch_reference(model, served):
    """Steps of every MoE layer: deferral on; masks from generate_gpu_experts_masks; a
    mask update mid-run (in place, as SGLang's dynamic expert update does it); the engine's
    own deferral selector; a kill -9 and restart mid-step, the step run again."""
    kt = _kt()
    layers = sorted(model["experts"])
    E = model["cfg"]["num_experts"]
    g = torch.Generator().manual_seed(1)
    masks = kt.generate_gpu_experts_masks(torch.rand(len(layers), E, generator=g), 12)
    wrappers = _wrappers(model, masks, k_defer=2)
    ref = Reference(model, 2)
    no_defer = Reference(model, 0)

    errs = []
    for step in range(2):
        inputs = _inputs(model, layers, 5, step)
        outs = _step(model, wrappers, inputs, masks)
        errs += _assert_close(outs, _reference(model, ref, inputs, masks))
        plain = _reference(model, no_defer, inputs, masks)
        assert max(_rel(o, p) for o, p in zip(outs, plain)) > 5 * TOL  # deferral shows

    # SGLang's dynamic update: new masks computed, copied into each wrapper's in place.
    masks = kt.generate_gpu_experts_masks(torch.rand(len(layers), E, generator=g), 12,
                                          strategy="uniform")
    for wr, m in zip(wrappers, masks):
        wr.gpu_experts_mask.copy_(m)
    gpu0 = int(masks[0].nonzero()[0])
    with pytest.raises(ms.MaskedError):  # the sidecar has it: a GPU expert is refused now
        wrappers[0].client.forward(layers[0], torch.zeros(1, model["cfg"]["hidden_size"]),
                                   torch.tensor([[gpu0]]), torch.tensor([[1.0]]))
    inputs = _inputs(model, layers, 5, 10)
    errs += _assert_close(_step(model, wrappers, inputs, masks),
                          _reference(model, ref, inputs, masks))

    # The engine installs its own selector (defer the highest-numbered experts first).
    def by_id(ids, scores, protected_k):
        k = ids.shape[1]
        order = torch.argsort(ids, dim=1)
        now = torch.zeros_like(ids, dtype=torch.bool).scatter_(
            1, order[:, :protected_k], True)
        minus = torch.full_like(ids, -1)
        return torch.where(now, ids, minus), torch.where(now, minus, ids)

    for wr in wrappers:
        wr.select_deferred_experts = by_id
    mine = Reference(model, 2, selector=by_id)
    inputs = _inputs(model, layers, 5, 11)
    errs += _assert_close(_step(model, wrappers, inputs, masks),
                          _reference(model, mine, inputs, masks))

    # Killed mid-step and restarted: the step fails once, then runs again equal.
    inputs = _inputs(model, layers, 5, 12)
    wr0, (x, ids, w) = wrappers[0], inputs[0]
    wr0.submit_forward(x, ids, w, 0)
    wr0.sync_forward(x, 0)
    os.kill(served.proc.pid, signal.SIGKILL)
    served.proc.wait(30)
    again = Sidecar(model["path"], socket=served.socket)
    try:
        with pytest.raises(ms.PeerDeadError):
            _step(model, wrappers[1:], inputs[1:], masks[1:])
        mine.owed = None
        outs = _step(model, wrappers, inputs, masks)
        errs += _assert_close(outs, _reference(model, mine, inputs, masks))
        assert wrappers[0].client.generation == 2
        with pytest.raises(ms.MaskedError):  # the updated mask came back with the channel
            wrappers[0].client.forward(layers[0],
                                       torch.zeros(1, model["cfg"]["hidden_size"]),
                                       torch.tensor([[gpu0]]), torch.tensor([[1.0]]))
    finally:
        again.stop(signal.SIGKILL)
    print(f"kt_kernel vs all-torch fp32: worst relative error {max(errs):.2e} over "
          f"{len(errs)} layer outputs")


def test_an_eplb_permutation_is_applied(model, served):
    kt = _kt()
    layers = sorted(model["experts"])
    E = model["cfg"]["num_experts"]
    masks = torch.zeros(len(layers), E, dtype=torch.bool)
    masks[:, 1] = True
    wrappers = _wrappers(model, masks, k_defer=0)
    perm = torch.roll(torch.arange(E), 3)  # physical p holds logical (p - 3) mod E
    for wr in wrappers:
        wr.load_weights(perm)
    inputs = _inputs(model, layers, 4, 20)
    ref = Reference(model, 0)
    logical = [(x, perm[ids], w) for x, ids, w in inputs]
    gpu_logical = [torch.zeros(E, dtype=torch.bool).index_fill_(0, perm[1:2], True)
                   for _ in layers]
    outs = []
    for wr, (x, ids, w), (_, lids, _) in zip(wrappers, inputs, logical):
        wr.submit_forward(x, ids, w, 0)
        gpu_out = _gpu_part(model, wr.layer_idx, x, lids, w, gpu_logical[0])
        outs.append(gpu_out + wr.sync_forward(x, 0))
    _assert_close(outs, _reference(model, ref, logical, gpu_logical))
    del kt


_RANK = r"""
import os, sys, torch
sys.path[:0] = sys.argv[1].split(":")
import kt_kernel
share, out = sys.argv[2], sys.argv[3]
d = torch.load(sys.argv[4])
outs = []
ws = []
for i, L in enumerate(d["layers"]):
    skip = d["gpu"][i].clone()
    skip[d["other"][share][i]] = True  # the experts another rank owns: not this one's
    ws.append(kt_kernel.KTMoEWrapper(layer_idx=L, gpu_experts_mask=skip,
              max_deferred_experts_per_token=0 if i == len(d["layers"]) - 1 else 2,
              **d["dims"]))
for w, (x, ids, wt) in zip(ws, d["inputs"]):
    w.submit_forward(x, ids, wt, 0)
    outs.append(w.sync_forward(x, 0))
torch.save(outs, out)
"""


def test_tp_ranks_owning_shares_of_the_cpu_experts_sum_to_one_rank(model, served, tmp_path):
    """Two rank processes, each its own wrappers and channel to the one sidecar, each
    computing a disjoint half of the CPU experts: their outputs sum to the single-rank one."""
    kt = _kt()
    cfg = model["cfg"]
    layers = sorted(model["experts"])
    E = cfg["num_experts"]
    gpu = torch.zeros(len(layers), E, dtype=torch.bool)
    gpu[:, :3] = True
    inputs = _inputs(model, layers, 4, 30)
    dims = dict(num_experts=E, num_experts_per_tok=cfg["num_experts_per_tok"],
                hidden_size=cfg["hidden_size"],
                moe_intermediate_size=cfg["moe_intermediate_size"])
    cpu = [e for e in range(E) if e >= 3]
    halves = {"0": [cpu[1::2]] * len(layers), "1": [cpu[0::2]] * len(layers)}  # the other's
    data = tmp_path / "in.pt"
    torch.save({"layers": layers, "gpu": gpu, "other": halves, "inputs": inputs,
                "dims": dims}, data)
    path = ":".join([os.path.join(BUILD, "python-kt"), os.path.join(BUILD, "python")])
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, path, r, str(tmp_path / r),
                               str(data)], stderr=subprocess.PIPE, text=True)
             for r in ("0", "1")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    ranks = [torch.load(tmp_path / r) for r in ("0", "1")]
    one = _wrappers(model, gpu, k_defer=2)
    single = [w.forward(x, ids, wt, 0) for w, (x, ids, wt) in zip(one, inputs)]
    for a, b, s in zip(*ranks, single):
        assert a.abs().sum() > 0 and b.abs().sum() > 0
        assert _rel(a.float() + b.float(), s.float()) < TOL
    del kt
