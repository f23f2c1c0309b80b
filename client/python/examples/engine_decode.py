#!/usr/bin/env python3
"""engine_decode.py — a small Qwen3-MoE decoder in torch whose MoE blocks run through moe-sidecar.

    build/tools/moe-gen --preset qwen3-30b-a3b --layers 4 --experts 16 --hidden 256 --ffn 128 \\
        --format bf16 --full-model --out /tmp/q3
    build/sidecar/moe-sidecar serve /tmp/q3 --socket /tmp/moe.sock &
    PYTHONPATH=build/python /usr/bin/python3 client/python/examples/engine_decode.py /tmp/q3 \\
        --socket /tmp/moe.sock --tokens 8 --gpu-experts 2 --defer 1 --check

What an engine does, in a few hundred lines: embedding, per block RMSNorm → attention (q/k
RMSNorm, RoPE with the config's rope_theta, a KV cache) → RMSNorm → MoE, final norm, lm_head;
greedy decoding. The MoE block routes with softmax top-k (renormalised when norm_topk_prob),
computes the first --gpu-experts experts of every layer itself with torch ("GPU experts",
on --device) and sends the rest to the sidecar through moe_sidecar.KTMoEWrapper, one wrapper
per layer, submit_forward → GPU experts → sync_forward → sum, with kt-kernel's deferral
(--defer K: the K lowest-weighted CPU experts of each token arrive in the next layer's
output). With --device cuda the wrapper takes the CUDA stream path (the engine's current
stream is passed; no host synchronisation inside the decode loop).

Weights come from the model directory `moe-gen --full-model` wrote (config.json and
*.safetensors, F32/F16/BF16), read here with a few lines of numpy: no `safetensors` package.

--check compares with an all-torch MoE block (fp32 math on the same weights, every expert
computed by torch) that models kt's deferral exactly: per layer beside the run, and end to
end in fp32 activations, where it asserts the same token ids and the same final hidden
states within bf16 rounding (TOL_BLOCK below says what and why).
--router-hints sends the sidecar what an engine can compute itself before a layer runs: the
next MoE layer's router applied to this layer's input ("pre-gating"), its top-k as a PREFETCH
hint (client.prefetch, moe_prefetch in C) while this layer computes; at the end it prints the
hints' precision and recall against the routing the next layer really chose (on moe-gen's
random weights they are near chance, top_k / n_experts: the mechanism is what is shown) and
the loads the hints started (STATS prefetches).
--gpu-prefill-above N (a sidecar started with --leases): MoE blocks of more than N tokens
lease the layer's CPU experts from the sidecar's slot pool and compute them with torch on
--device (LeasePrefillMoE); decode stays on the sidecar. Each leased layer's timeline (lease,
copy, compute, release) is printed after the prefill.
--transformers loads the directory with transformers' Qwen3MoeForCausalLM and compares the
prompt's logits with this file's all-torch model, both in fp32 (skipped, saying so, where
transformers is not importable). The exit status is 0 only if every check that ran passed.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# ---- safetensors, read by hand -------------------------------------------------------------

_ST_NUMPY = {"BF16": np.int16, "F16": np.float16, "F32": np.float32}


def read_safetensors(model_dir):
    """{name: CPU tensor} over every *.safetensors file of model_dir (F32, F16, BF16).

    A safetensors file is an 8-byte little-endian header length, a JSON header
    {name: {dtype, shape, data_offsets: [begin, end]}} and the data; offsets are relative to
    the end of the header."""
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit(f"{model_dir}: no *.safetensors files")
    out = {}
    for name in files:
        path = os.path.join(model_dir, name)
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size - 8:
                raise SystemExit(f"{path}: header length {n} beyond the file ({size} bytes)")
            header = json.loads(fh.read(n))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            dt, shape, (b, e) = meta["dtype"], meta["shape"], meta["data_offsets"]
            if dt not in _ST_NUMPY:
                raise SystemExit(f"{path}: {key} is {dt}; this example reads F32, F16, BF16")
            count = int(np.prod(shape)) if shape else 1
            if e - b != count * np.dtype(_ST_NUMPY[dt]).itemsize or e > data.shape[0]:
                raise SystemExit(f"{path}: {key}: bad data_offsets {b}..{e}")
            arr = np.array(data[b:e]).view(_ST_NUMPY[dt])  # a copy, aligned
            t = torch.from_numpy(arr)
            if dt == "BF16":
                t = t.view(torch.bfloat16)
            out[key] = t.reshape(shape)
        del data
    return out


# ---- the model -------------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    """Qwen3's RMSNorm: in fp32, back to x's dtype, times the gain (transformers' order)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def swiglu_experts(x, gate, up, down):
    """Every expert on every token: x [n, H], gate/up [E, F, H], down [E, H, F] -> [E, n, H]."""
    h = F.silu(torch.einsum("nh,efh->enf", x, gate)) * torch.einsum("nh,efh->enf", x, up)
    return torch.einsum("enf,ehf->enh", h, down)


class Config:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as fh:
            c = json.load(fh)
        if c.get("model_type") != "qwen3_moe":
            raise SystemExit(f"{d}: model_type {c.get('model_type')}; this example is Qwen3-MoE")
        if "num_attention_heads" not in c:
            raise SystemExit(f"{d}: no attention in config.json: generate with --full-model")
        self.raw = c
        self.vocab = c["vocab_size"]
        self.hidden = c["hidden_size"]
        self.n_layers = c["num_hidden_layers"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv = c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or self.hidden // self.n_heads
        self.eps = c["rms_norm_eps"]
        self.rope_theta = float(c.get("rope_theta", 10000.0))
        if c.get("rope_scaling"):
            raise SystemExit(f"{d}: rope_scaling {c['rope_scaling']} is not modelled here")
        self.n_experts = c["num_experts"]
        self.top_k = c["num_experts_per_tok"]
        self.ffn = c["moe_intermediate_size"]
        self.norm_topk_prob = bool(c.get("norm_topk_prob", False))
        sparse = c.get("decoder_sparse_step", 1)
        self.moe_layers = [L for L in range(self.n_layers)
                           if L not in c.get("mlp_only_layers", []) and (L + 1) % sparse == 0]
        self.tie = bool(c.get("tie_word_embeddings", False))


class Model:
    """Qwen3-MoE weights on one device, in one activation dtype, and the forward pass.
    The MoE block is a callable moe(layer, x, ids, weights) -> [n, H] given to forward()."""

    def __init__(self, cfg, tensors, device, dtype):
        self.cfg, self.device, self.dtype = cfg, device, dtype

        def w(name, dt=dtype):
            return tensors[name].to(device=device, dtype=dt)

        self.embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        self.lm_head_f32 = w("model.embed_tokens.weight" if cfg.tie else "lm_head.weight",
                             torch.float32)
        self.layers = []
        for L in range(cfg.n_layers):
            p = f"model.layers.{L}."
            layer = {k: w(p + n) for k, n in (
                ("in_norm", "input_layernorm.weight"),
                ("post_norm", "post_attention_layernorm.weight"),
                ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"),
                ("q_norm", "self_attn.q_norm.weight"), ("k_norm", "self_attn.k_norm.weight"))}
            if L in cfg.moe_layers:
                layer["router"] = w(p + "mlp.gate.weight", torch.float32)
                for proj in ("gate", "up", "down"):  # [E, F, H] / [E, H, F], as stored (bf16)
                    layer[proj] = torch.stack([tensors[f"{p}mlp.experts.{e}.{proj}_proj.weight"]
                                               for e in range(cfg.n_experts)]).to(device)
            else:
                layer["dense"] = tuple(w(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up", "down"))
            self.layers.append(layer)
        d = cfg.head_dim
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64)
                                                  .to(device=device, dtype=torch.float32) / d))
        self._f32 = {}

    def experts_f32(self, L, first=0, last=None):
        """Layer L's experts [first, last) as fp32 (exact: widened from the stored bf16)."""
        key = (L, first, last)
        if key not in self._f32:
            ly = self.layers[L]
            self._f32[key] = tuple(ly[p][first:last].float() for p in ("gate", "up", "down"))
        return self._f32[key]

    def new_cache(self, max_len):
        c = self.cfg
        shape = (c.n_layers, max_len, c.n_kv, c.head_dim)
        return {"k": torch.zeros(shape, dtype=self.dtype, device=self.device),
                "v": torch.zeros(shape, dtype=self.dtype, device=self.device)}

    def rope(self, pos0, n):
        pos = torch.arange(pos0, pos0 + n, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    def attention(self, L, x, pos0, cache):
        c, ly = self.cfg, self.layers[L]
        n, d = x.shape[0], c.head_dim
        q = rms_norm(F.linear(x, ly["q"]).view(n, c.n_heads, d), ly["q_norm"], c.eps)
        k = rms_norm(F.linear(x, ly["k"]).view(n, c.n_kv, d), ly["k_norm"], c.eps)
        v = F.linear(x, ly["v"]).view(n, c.n_kv, d)
        cos, sin = self.rope(pos0, n)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache["k"][L, pos0:pos0 + n] = k
        cache["v"][L, pos0:pos0 + n] = v
        T = pos0 + n
        rep = c.n_heads // c.n_kv  # kv head j serves query heads j*rep .. j*rep+rep-1
        K = cache["k"][L, :T].repeat_interleave(rep, dim=1)
        V = cache["v"][L, :T].repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, K) * (d ** -0.5)
        qpos = torch.arange(pos0, T, device=self.device)
        causal = torch.arange(T, device=self.device)[None, :] <= qpos[:, None]
        s = s.masked_fill(~causal, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(self.dtype)
        o = torch.einsum("hqk,khd->qhd", p, V).reshape(n, c.n_heads * d)
        return F.linear(o, ly["o"])

    def route(self, L, x):
        """Softmax over the experts in fp32, top-k, renormalised when norm_topk_prob:
        (ids int64 [n, k], weights fp32 [n, k]), as transformers' Qwen3-MoE router."""
        probs = torch.softmax(F.linear(x.float(), self.layers[L]["router"]), dim=-1)
        w, ids = torch.topk(probs, self.cfg.top_k, dim=-1)
        if self.cfg.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return ids, w

    def forward(self, tokens, pos0, cache, moe, timer=None, all_logits=False, hints=None):
        """tokens [n] (a device tensor) at positions pos0.. -> (final-norm hidden of the last
        position [H], logits [V] of the last position, or [n, V] with all_logits)."""
        c = self.cfg
        x = F.embedding(tokens, self.embed)
        for L in range(c.n_layers):
            ly = self.layers[L]
            x = x + self.attention(L, rms_norm(x, ly["in_norm"], c.eps), pos0, cache)
            h = rms_norm(x, ly["post_norm"], c.eps)
            if L in c.moe_layers:
                if timer:
                    timer.start(L)
                ids, w = self.route(L, h)
                if hints is not None:
                    hints.before(L, h, ids)
                y = moe(L, h, ids, w)
                if timer:
                    timer.stop(L)
            else:
                g, u, dn = ly["dense"]
                y = F.linear(F.silu(F.linear(h, g)) * F.linear(h, u), dn)
            x = x + y
        x = rms_norm(x, self.norm, c.eps)
        # Logits in fp32 (bf16 logits tie too often for a well-defined greedy choice).
        logits = F.linear((x if all_logits else x[-1:]).float(), self.lm_head_f32)
        return x[-1], (logits if all_logits else logits[0])


# ---- router hints (pre-gating) ------------------------------------------------------------------


class RouterHints:
    """--router-hints: before MoE layer L computes, the next MoE layer's router on L's input
    h; its top-k experts (over every row of h, each with its best probability, scaled by k as
    the sidecar's scores are) go to the sidecar as a PREFETCH hint for that layer. Each hint
    is scored against the routing its layer then really chose."""

    def __init__(self, model, client):
        self.model, self.client = model, client
        moe = list(model.cfg.moe_layers)
        self.next = dict(zip(moe, moe[1:]))
        self.pending = {}
        self.sent = self.hits = self.true = self.calls = 0

    def hinted(self, nxt, h):
        """The hint for MoE layer nxt on input h [n, H]: ([ids], [scores]), best first."""
        k = self.model.cfg.top_k
        probs = torch.softmax(F.linear(h.float(), self.model.layers[nxt]["router"]), dim=-1)
        p, top = torch.topk(probs, k, dim=-1)
        best = {}
        for e, s in zip(top.reshape(-1).tolist(), p.reshape(-1).tolist()):
            best[e] = max(best.get(e, 0.0), s)
        ids = sorted(best, key=lambda e: (-best[e], e))
        return ids, [best[e] * k for e in ids]

    def before(self, L, h, ids):
        if L in self.pending:
            hinted, truth = self.pending.pop(L), set(ids.reshape(-1).tolist())
            self.sent += len(hinted)
            self.true += len(truth)
            self.hits += len(hinted & truth)
        nxt = self.next.get(L)
        if nxt is None:
            return
        hint_ids, scores = self.hinted(nxt, h)
        self.client.prefetch(nxt, hint_ids, scores)
        self.calls += 1
        self.pending[nxt] = set(hint_ids)

    def summary(self):
        prec = self.hits / self.sent if self.sent else float("nan")
        rec = self.hits / self.true if self.true else float("nan")
        return (f"router hints: {self.calls} PREFETCH(es), {self.sent} experts hinted; "
                f"precision {prec:.3f}, recall {rec:.3f} against the next layer's routing "
                f"(chance: top_k/n_experts = {self.model.cfg.top_k / self.model.cfg.n_experts:.3f})")


# ---- the two MoE blocks ------------------------------------------------------------------------


class SidecarMoE:
    """The engine's MoE block: GPU experts by torch, the rest through KTMoEWrapper (one per
    layer, sharing the process's channel), in SGLang's kt_ep_wrapper order: submit the CPU
    part, run the GPU experts meanwhile, sync, add."""

    def __init__(self, model, model_dir, socket, gpu_experts, k_defer):
        from moe_sidecar import KTMoEWrapper

        c = model.cfg
        self.model, self.G = model, gpu_experts
        self.wrappers = {}
        for L in c.moe_layers:
            w = KTMoEWrapper(layer_idx=L, num_experts=c.n_experts, num_experts_per_tok=c.top_k,
                             hidden_size=c.hidden, moe_intermediate_size=c.ffn,
                             num_gpu_experts=gpu_experts, cpuinfer_threads=os.cpu_count(),
                             threadpool_count=1, weight_path=model_dir,
                             chunked_prefill_size=8192, cpu_save=False,
                             max_deferred_experts_per_token=k_defer, method="BF16",
                             socket=socket)
            w.load_weights()  # checks the sidecar serves this very model (fingerprint)
            self.wrappers[L] = w
        if self.G:
            self.gpu = {L: tuple(model.layers[L][p][:self.G].to(model.dtype)
                                 for p in ("gate", "up", "down")) for L in c.moe_layers}

    def gpu_part(self, L, x, ids, w):
        """The GPU experts' share, in the activation dtype, without host synchronisation:
        a dense [n, G] weight matrix (0 where a token did not pick the expert)."""
        on = ids < self.G
        coef = torch.zeros(ids.shape[0], self.G, dtype=torch.float32, device=x.device)
        coef.scatter_add_(1, torch.where(on, ids, torch.zeros_like(ids)),
                          torch.where(on, w, torch.zeros_like(w)))
        y = swiglu_experts(x, *self.gpu[L])  # [G, n, H]
        return torch.einsum("ng,gnh->nh", coef.to(x.dtype), y)

    def __call__(self, L, x, ids, w):
        wr = self.wrappers[L]
        stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None
        wr.submit_forward(x, ids, w, stream)
        gpu = self.gpu_part(L, x, ids, w) if self.G else None
        cpu = wr.sync_forward(x, stream)
        return cpu if gpu is None else gpu + cpu

    def check(self):
        for w in self.wrappers.values():
            w.check()  # a failure recorded by a stream host function is raised here


class LeasePrefillMoE:
    """--gpu-prefill-above N: a MoE block of more than N tokens (a long prompt's prefill)
    computes the layer's CPU experts itself, with torch on the engine's device, from experts
    leased out of the sidecar's slot pool (Client.lease: the sidecar reads them from disk if
    they are not resident and pins them; the engine copies their rows out of the read-only
    mapping, computes, releases); the GPU experts as SidecarMoE does. Blocks of N tokens or
    fewer (decode) go to the sidecar (inner). No deferral in a leased block: a prefill is
    compared with a sidecar prefill run with --defer 0. timeline: per leased layer, seconds
    of (lease, copy, compute, release)."""

    def __init__(self, inner, client, above, dtype="raw"):
        self.inner, self.client, self.above, self.dtype = inner, client, above, dtype
        self.timeline = []

    def __call__(self, L, x, ids, w):
        if ids.shape[0] <= self.above:
            return self.inner(L, x, ids, w)
        G, E = self.inner.G, self.inner.model.cfg.n_experts
        dev = x.device
        t0 = time.perf_counter()
        lease = self.client.lease(L, list(range(G, E)), dtype=self.dtype)
        t1 = time.perf_counter()
        try:
            if self.dtype == "bf16":  # the sidecar's BF16 rows, zero-copy views of staging
                views = lease.views()
                mats = [torch.stack([v[p] for v in views]).to(dev, x.dtype)
                        for p in ("gate", "up", "down")]
            else:
                mats = [torch.stack([lease.rows(i, p) for i in range(E - G)]).to(dev, x.dtype)
                        for p in ("gate", "up", "down")]
            sync(dev)
            t2 = time.perf_counter()
            cpu = ids >= G
            coef = torch.zeros(ids.shape[0], E - G, dtype=torch.float32, device=dev)
            coef.scatter_add_(1, torch.where(cpu, ids - G, torch.zeros_like(ids)),
                              torch.where(cpu, w, torch.zeros_like(w)))
            y = swiglu_experts(x, *mats)  # [E - G, n, H]
            out = torch.einsum("ne,enh->nh", coef.to(x.dtype), y)
            if G:
                out = out + self.inner.gpu_part(L, x, ids, w)
            sync(dev)
            t3 = time.perf_counter()
        finally:
            lease.release()
        self.timeline.append((L, t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3))
        return out

    def check(self):
        self.inner.check()


class TorchMoE:
    """The oracle: every expert by torch in fp32 on the same (bf16-stored) weights, with
    kt-kernel's deferral modelled as moe-sidecar implements it (docs/protocol.md, FORWARD):
    of each token's CPU entries (expert >= gpu_experts) ordered by weight, descending, ties
    by position, the last min(k_defer, count) are deferred; their weighted sum is added to
    the NEXT MoE layer's output; the last MoE layer never defers, and nothing is deferred
    from a batch larger than the channel's max_tokens (the wrapper splits it)."""

    def __init__(self, model, gpu_experts=0, k_defer=0, max_tokens=256):
        self.model, self.G, self.k_defer, self.max_tokens = model, gpu_experts, k_defer, max_tokens
        self.owed = None

    def __call__(self, L, x, ids, w):
        c = self.model.cfg
        n, k = ids.shape
        k_eff = self.k_defer if (L != c.moe_layers[-1] and n <= self.max_tokens) else 0
        cpu = ids >= self.G
        deferred = torch.zeros_like(cpu)
        if k_eff:
            order = torch.sort(torch.where(cpu, w, torch.full_like(w, -math.inf)), dim=1,
                               descending=True, stable=True).indices
            rank = torch.empty_like(order)
            rank.scatter_(1, order, torch.arange(k, device=ids.device).expand(n, k).contiguous())
            n_cpu = cpu.sum(dim=1, keepdim=True)
            deferred = cpu & (rank >= n_cpu - n_cpu.clamp(max=k_eff))
        zero = torch.zeros_like(w)
        coef_now = torch.zeros(n, c.n_experts, dtype=torch.float32, device=x.device)
        coef_now.scatter_add_(1, ids, torch.where(deferred, zero, w))
        y = swiglu_experts(x.float(), *self.model.experts_f32(L))  # [E, n, H], fp32
        out = torch.einsum("ne,enh->nh", coef_now, y)
        if self.owed is not None:
            out = out + self.owed
        self.owed = None
        if k_eff:
            coef_later = torch.zeros_like(coef_now)
            coef_later.scatter_add_(1, ids, torch.where(deferred, w, zero))
            self.owed = torch.einsum("ne,enh->nh", coef_later, y)
        self.last = out  # fp32, before the rounding into the activation dtype
        return out.to(x.dtype)


class Lockstep:
    """--check's per-layer oracle: every MoE block of a sidecar run is also computed by the
    TorchMoE oracle on the very same input (routing included), and by a second oracle that
    ignores deferral, to show that the comparison sees it. Records the worst relative error
    max|run - oracle| / max|oracle| per layer."""

    def __init__(self, run, oracle, plain):
        self.run, self.oracle, self.plain = run, oracle, plain
        self.worst, self.worst_plain, self.calls = {}, {}, 0

    def __call__(self, L, x, ids, w):
        a = self.run(L, x, ids, w).float()
        self.oracle(L, x, ids, w)
        self.plain(L, x, ids, w)
        b, c = self.oracle.last, self.plain.last
        scale = b.abs().max().clamp(min=1e-30)
        self.worst[L] = max(self.worst.get(L, 0.0), ((a - b).abs().max() / scale).item())
        self.worst_plain[L] = max(self.worst_plain.get(L, 0.0),
                                  ((c - b).abs().max() / scale).item())
        self.calls += 1
        return a.to(x.dtype)


# ---- timing and decoding -------------------------------------------------------------------


class LayerTimer:
    """Per-layer MoE block time: CUDA events on the stream (no host sync until the end), or
    perf_counter on the CPU (the CPU path's sync_forward returns the result)."""

    def __init__(self, cuda):
        self.cuda, self.marks, self.open = cuda, [], {}

    def start(self, L):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.open[L] = e
        else:
            self.open[L] = time.perf_counter()

    def stop(self, L):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((L, self.open.pop(L), e))
        else:
            self.marks.append((L, self.open.pop(L), time.perf_counter()))

    def per_layer_ms(self):
        acc = {}
        for L, a, b in self.marks:
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            acc.setdefault(L, []).append(ms)
        return {L: sum(v) / len(v) for L, v in sorted(acc.items())}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(model, moe, prompt, n_new, timer=None, hints=None):
    """Greedy decoding of n_new tokens after prompt. Returns (token ids, final hidden states
    [n_new, H] (the final-norm output each token was chosen from), prompt logits [P, V],
    prefill seconds, decode seconds for the n_new - 1 tokens after the first)."""
    dev = model.device
    cache = model.new_cache(len(prompt) + n_new)
    toks, finals = [], []
    with torch.no_grad():
        sync(dev)
        t0 = time.perf_counter()
        h, logits = model.forward(torch.tensor(prompt, device=dev), 0, cache, moe,
                                  all_logits=True, hints=hints)
        nxt = logits[-1].argmax().view(1)
        toks.append(nxt)
        finals.append(h)
        sync(dev)
        t1 = time.perf_counter()
        for i in range(1, n_new):  # no host sync in here: the token stays on the device
            h, lg = model.forward(nxt, len(prompt) + i - 1, cache, moe, timer, hints=hints)
            nxt = lg.argmax().view(1)
            toks.append(nxt)
            finals.append(h)
        sync(dev)
        t2 = time.perf_counter()
    return (torch.cat(toks).tolist(), torch.stack(finals).float(), logits.float(), t1 - t0,
            t2 - t1)


# ---- checks ----------------------------------------------------------------------------------

# --check has two parts, both against the TorchMoE oracle (fp32 math on the stored bf16
# weights, kt's deferral modelled):
#
# 1. Per layer, in the run's own dtype (Lockstep): the decode is repeated with the oracle
#    computing every MoE block beside the sidecar on the very same input, and must give the
#    same tokens as the timed run (the sidecar is deterministic). Each block must satisfy
#    max|run - oracle| <= TOL_BLOCK * max|oracle| with TOL_BLOCK = 2^-5. Why: the sidecar's
#    BF16 kernels round each token's activations and the SwiGLU intermediate to bf16 for
#    their dot products (kernels/ffn.c) and round the output once into the activation dtype;
#    with bf16 activations the GPU experts' matmuls round too. Each is a relative 2^-9; a
#    handful of them stays well inside 2^-5 of the block's largest output (measured here:
#    <= 2^-6.9 in bf16, <= 2^-7.8 in fp32), while leaving a deferred expert out or adding it
#    to the wrong layer moves the block by ~20% of it (the no-deferral oracle's distance is
#    printed next to it).
# 2. End to end, in fp32 activations: a sidecar decode and an oracle decode, independently,
#    must choose the same token ids, and their final hidden states (the final-norm output
#    each token was chosen from, elements of order 1) must agree within TOL_ABS = 2^-6 per
#    element and TOL_REL = 2^-8 relative L2 per row. Why fp32: then the only difference is the
#    sidecar's bf16 rounding inside its kernels, a relative 2^-9 per block output, which the
#    residual stream dilutes (measured: <= 1.5e-3 absolute, 4.3e-4 relative — both ~10x
#    inside). With a bf16 residual stream, an error far below one bf16 step still flips the
#    rounding of some residual elements, and 4 blocks amplify that: in 15 random prompts
#    measured here 3 decodes of the oracle and the sidecar diverged in a token, which is
#    bf16 arithmetic, not a fault — so token identity is asserted in fp32, and the bf16 path
#    is checked per layer (part 1).
TOL_BLOCK, TOL_ABS, TOL_REL = 2.0 ** -5, 2.0 ** -6, 2.0 ** -8


def compare_finals(a, b):
    d = (a - b).abs()
    rel = ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp(min=1e-30)).max().item()
    return d.max().item(), rel


def check_transformers(model_dir, cfg, tensors, prompt, device):
    """Logits of the prompt from transformers' Qwen3MoeForCausalLM vs this file's all-torch
    model, both fp32 on the same weights. True (passed or skipped) / False."""
    try:
        import transformers
        from transformers import Qwen3MoeForCausalLM
    except ImportError as e:
        print(f"transformers: SKIPPED (not importable here: {e})")
        return True
    kw = {"attn_implementation": "eager", "output_loading_info": True}
    try:
        hf, info = Qwen3MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    except TypeError:  # an older transformers spells it torch_dtype
        hf, info = Qwen3MoeForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **kw)
    if next(hf.parameters()).dtype != torch.float32:
        hf = hf.float()
    hf = hf.to(device).eval()
    bad_keys = {k: v for k, v in info.items()
                if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    ours = Model(cfg, tensors, device, torch.float32)
    if device.type == "cuda":  # full fp32 on both sides: no TF32 matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        theirs = hf(ids).logits[0].float()
        _, mine = ours.forward(ids[0], 0, ours.new_cache(len(prompt)), TorchMoE(ours),
                               all_logits=True)
    scale = theirs.abs().max().item()
    diff = (theirs - mine).abs().max().item()
    same_argmax = bool((theirs.argmax(-1) == mine.argmax(-1)).all())
    # fp32 on both sides: only summation orders differ (~1e-6 relative); a wrong detail of
    # the architecture (RoPE layout, q/k norm, GQA mapping, renormalisation) is O(1).
    tol = 1e-4 * max(1.0, scale)
    ok = not bad_keys and diff <= tol and same_argmax
    print(f"transformers {transformers.__version__}: Qwen3MoeForCausalLM logits of the "
          f"{len(prompt)}-token prompt vs this model (fp32, {device.type}): max |diff| "
          f"{diff:.3g} (logits up to {scale:.3g}, tolerance {tol:.3g}), argmax "
          f"{'equal' if same_argmax else 'DIFFERENT'}"
          f"{', loading: ' + str(bad_keys) if bad_keys else ''} -> "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def run_checks(args, cfg, tensors, model, moe, client, prompt, toks, device):
    """--check, parts 1 and 2 (see TOL_BLOCK above). True if both passed."""
    G, K, mt = args.gpu_experts, args.defer, client.max_tokens
    ls = Lockstep(moe, TorchMoE(model, G, K, mt), TorchMoE(model, G, 0, mt))
    l_toks = decode(model, ls, prompt, args.tokens)[0]
    moe.check()
    worst, plain = max(ls.worst.values()), max(ls.worst_plain.values())
    ok1 = worst <= TOL_BLOCK and l_toks == toks
    print(f"check 1, per layer ({args.dtype}): {ls.calls} MoE blocks beside the fp32 oracle "
          f"with kt deferral: worst max|diff|/max|oracle| {worst:.2e} (tolerance "
          f"{TOL_BLOCK:.2e}; the oracle without deferral is {plain:.2e} away); tokens "
          f"{'as the timed run' if l_toks == toks else 'DIFFERENT: ' + str(l_toks)} -> "
          f"{'PASS' if ok1 else 'FAIL'}")

    m32 = model if model.dtype == torch.float32 else Model(cfg, tensors, device, torch.float32)
    run32 = moe if m32 is model else SidecarMoE(m32, args.model, args.socket, G, K)
    s_toks, s_fin = decode(m32, run32, prompt, args.tokens)[:2]
    run32.check()
    r_toks, r_fin = decode(m32, TorchMoE(m32, G, K, mt), prompt, args.tokens)[:2]
    dmax, rel = compare_finals(s_fin, r_fin)
    ok2 = s_toks == r_toks and dmax <= TOL_ABS and rel <= TOL_REL
    print(f"check 2, end to end (fp32 activations): sidecar {s_toks}, oracle "
          f"{'the same' if s_toks == r_toks else r_toks}; final hidden states max |diff| "
          f"{dmax:.2e} (tolerance {TOL_ABS:.2e}), worst row relative L2 {rel:.2e} (tolerance "
          f"{TOL_REL:.2e}) -> {'PASS' if ok2 else 'FAIL'}")
    return ok1 and ok2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a `moe-gen --full-model` safetensors directory (F32/F16/BF16)")
    ap.add_argument("--socket", default=os.environ.get("MOE_SIDECAR_SOCKET"),
                    help="the sidecar's socket (default $MOE_SIDECAR_SOCKET)")
    ap.add_argument("--prompt", default="256,72,105,33",
                    help="comma-separated token ids (default: 256,72,105,33)")
    ap.add_argument("--tokens", type=int, default=8, help="tokens to generate (default 8)")
    ap.add_argument("--gpu-experts", type=int, default=2,
                    help="the first N experts of each layer are computed by torch (default 2)")
    ap.add_argument("--defer", type=int, default=1,
                    help="max_deferred_experts_per_token (default 1)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                    help="activation dtype (default bf16, as an engine)")
    ap.add_argument("--check", action="store_true",
                    help="decode again with an all-torch fp32 MoE block and compare")
    ap.add_argument("--router-hints", action="store_true",
                    help="PREFETCH the next layer's router top-k on this layer's input")
    ap.add_argument("--gpu-prefill-above", type=int, default=None, metavar="N",
                    help="MoE blocks of more than N tokens (a long prompt's prefill) lease "
                    "the layer's CPU experts from the sidecar (serve --leases) and compute "
                    "them with torch on --device; decode stays on the sidecar")
    ap.add_argument("--lease-dtype", choices=("raw", "bf16"), default="raw",
                    help="--gpu-prefill-above's leases: the served rows (raw), or BF16 rows "
                    "the sidecar dequantizes into the channel's staging area (serve "
                    "--lease-staging-mib): engines without kernels for the format")
    ap.add_argument("--transformers", action="store_true",
                    help="compare the prompt's logits with transformers' Qwen3MoeForCausalLM")
    args = ap.parse_args()

    prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
    if not prompt or args.tokens < 1:
        ap.error("need a prompt and --tokens >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else \
        torch.device("cpu")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    cfg = Config(args.model)
    if not 0 <= args.gpu_experts <= cfg.n_experts:
        ap.error(f"--gpu-experts must be in 0..{cfg.n_experts}")
    if any(not 0 <= t < cfg.vocab for t in prompt):
        ap.error(f"prompt token ids must be in 0..{cfg.vocab - 1}")
    tensors = read_safetensors(args.model)
    model = Model(cfg, tensors, device, dtype)
    print(f"model: {args.model}: qwen3_moe, {cfg.n_layers} layers ({len(cfg.moe_layers)} MoE), "
          f"{cfg.n_experts} experts top-{cfg.top_k}, hidden {cfg.hidden}, expert ffn {cfg.ffn}, "
          f"{cfg.n_heads}/{cfg.n_kv} heads of {cfg.head_dim}, vocab {cfg.vocab}, "
          f"rope_theta {cfg.rope_theta:g}")

    moe = SidecarMoE(model, args.model, args.socket, args.gpu_experts, args.defer)
    client = next(iter(moe.wrappers.values())).client
    if args.gpu_prefill_above is not None:
        if args.gpu_experts == cfg.n_experts:
            ap.error("--gpu-prefill-above: every expert is a GPU expert already")
        moe = LeasePrefillMoE(moe, client, args.gpu_prefill_above, args.lease_dtype)
    print(f"sidecar: pid {client.info['sidecar_pid']}, serves {client.info['model_name']} "
          f"{client.fingerprint} (= the directory's fingerprint), max_tokens "
          f"{client.max_tokens}")
    print(f"run: device {device}, {args.dtype} activations, GPU experts {args.gpu_experts}/"
          f"{cfg.n_experts} per layer, defer {args.defer}, prompt {len(prompt)} tokens, "
          f"{args.tokens} new tokens")

    timer = LayerTimer(device.type == "cuda")
    hints = RouterHints(model, client) if args.router_hints else None
    prefetches0 = client.stats().get("prefetches", 0) if hints else 0
    toks, finals, _, t_prefill, t_decode = decode(model, moe, prompt, args.tokens, timer, hints)
    moe.check()
    print(f"tokens: {toks}")
    print(f"prefill: {len(prompt)} tokens in {t_prefill * 1e3:.1f} ms")
    for L, *t in getattr(moe, "timeline", []):
        print(f"  leased layer {L}: lease {t[0] * 1e3:.3f} ms, copy {t[1] * 1e3:.3f} ms, "
              f"compute {t[2] * 1e3:.3f} ms, release {t[3] * 1e3:.3f} ms")
    if args.tokens > 1:
        print(f"decode: {args.tokens - 1} tokens in {t_decode * 1e3:.1f} ms = "
              f"{(args.tokens - 1) / t_decode:.1f} tokens/s")
        stats = {s["layer"]: s for s in client.stats().get("layers", [])}
        print("MoE block per layer, mean over decode steps (submit, GPU experts, sync, add; "
              "sidecar: p50 over every request it served):")
        for L, ms in timer.per_layer_ms().items():
            s = stats.get(L, {})
            side = (f"  sidecar compute p50 {s['compute_us']['p50']} us, total p50 "
                    f"{s['total_us']['p50']} us" if s else "")
            print(f"  layer {L}: {ms:.3f} ms{side}")

    if hints:
        print(hints.summary())
        print(f"router hints: {client.stats().get('prefetches', 0) - prefetches0} load(s) "
              "started by them (the rest were resident or in flight)")
    ok = True
    if args.check:
        ok = run_checks(args, cfg, tensors, model, moe, client, prompt, toks, device) and ok
    if args.transformers:
        ok = check_transformers(args.model, cfg, tensors, prompt, device) and ok
    print("result: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
