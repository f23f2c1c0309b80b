"""kt_kernel.KTMoEWrapper: kt-kernel's class as an engine calls it, over moe_sidecar.

A thin layer over moe_sidecar.KTMoEWrapper (the channel, the stream path, restarts) that adds
what an engine written for kt-kernel relies on and moe_sidecar's class leaves out:

- kt's constructor as SGLang calls it. The engine decides which processes build wrappers, so
  every wrapper built computes (kt has no TP rank): rank 0 alone as SGLang does, or each TP
  rank owning a disjoint share of the CPU experts through its own mask (each rank process
  has its own channel to the one sidecar). gpu_experts_mask None means every expert here;
  num_gpu_experts the first N. Keywords with no meaning here are reported once per process
  in a log line. swiglu_limit/swiglu_alpha are checked against the served model's.
- load_weights(physical_to_logical_map): EPLB's map of physical to logical experts. The
  identity costs nothing; a permutation is applied to every id (and to the mask the sidecar
  is sent); redundant experts (two physical ids for one logical) are refused.
- Deferral as kt does it: kt's own rule (select_deferred_experts: each token's
  num_experts_per_tok - max_deferred highest-scored protected, an expert protected for any
  token immediate for all) is applied by the sidecar (FWD_DEFER_UNION), on CPU tensors and on
  the CUDA stream path alike; the deferred part is added to the next MoE layer's output. An
  engine that installs its own selector on the wrapper gets its split sent as two requests
  (CPU tensors only).
- gpu_experts_mask is a CPU bool tensor the engine may update in place at run time
  (SGLang's dynamic expert update does wrapper.gpu_experts_mask.copy_(new)): the change is
  sent to the sidecar (set_gpu_mask) at once, and checked again at each submit_forward.
"""

import logging
import os
import weakref

import torch

import moe_sidecar
from moe_sidecar.kt import KTMoEWrapper as _SidecarWrapper

from .experts_base import default_deferred_split

log = logging.getLogger("kt_kernel")

# kt-kernel keywords that configure kt's own CPU engine: here `moe-sidecar serve` owns it.
_NO_EFFECT = {
    "cpuinfer_threads": "serve --threads",
    "threadpool_count": "serve --numa (one pool per NUMA node)",
    "numa_nodes": "serve --numa",
    "method": "the served files' format picks the kernels",
    "cpu_save": "serve --mem-budget",
}
_reported = set()


def _report_no_effect(given):
    """One log line per process for the keywords given that have no effect here."""
    new = {k: v for k, v in given.items() if k not in _reported}
    if not new:
        return
    _reported.update(new)
    parts = [f"{k}={v!r} ({_NO_EFFECT.get(k, 'no equivalent')})" for k, v in sorted(new.items())]
    log.warning("kt_kernel (moe-sidecar %s): no effect here: %s", moe_sidecar.__version__,
                "; ".join(parts))


class _GpuExpertsMask(torch.Tensor):
    """The wrapper's gpu_experts_mask: a plain CPU bool tensor whose in-place updates
    (copy_, fill_, item assignment…) reach the sidecar at once."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        name = getattr(func, "__name__", "")
        if args and type(args[0]) is cls and (
                name == "__setitem__" or (name.endswith("_") and not name.startswith("_"))):
            ref = args[0].__dict__.get("_kt_owner")
            owner = ref() if ref is not None else None
            if owner is not None:
                owner._sync_gpu_mask()
        return out


class KTMoEWrapper(_SidecarWrapper):
    """kt-kernel's KTMoEWrapper over a moe-sidecar; see the module's docstring. The five
    dimensions may be given by position, everything else by keyword (as SGLang does)."""

    def __init__(self, layer_idx, num_experts, num_experts_per_tok, hidden_size,
                 moe_intermediate_size, *, gpu_experts_mask=None, num_gpu_experts=None,
                 cpuinfer_threads=None, threadpool_count=None, numa_nodes=None,
                 weight_path=None, chunked_prefill_size=None, method=None, cpu_save=None,
                 max_deferred_experts_per_token=None, swiglu_limit=None, swiglu_alpha=None,
                 mode="inference", **other):
        if mode != "inference":
            raise NotImplementedError(f"mode={mode!r}: moe-sidecar serves inference only "
                                      "(kt-kernel's SFT wrappers have no equivalent)")
        E = int(num_experts)
        if gpu_experts_mask is not None:
            mask = [bool(x) for x in torch.as_tensor(gpu_experts_mask).reshape(-1).tolist()]
            if num_gpu_experts:
                raise ValueError("gpu_experts_mask or num_gpu_experts, not both: the mask "
                                 "names the GPU's experts, the count the first ones")
        else:
            n = int(num_gpu_experts or 0)
            if not 0 <= n <= E:
                raise ValueError(f"num_gpu_experts={n} not in 0..{E}")
            mask = [e < n for e in range(E)]
        given = dict(cpuinfer_threads=cpuinfer_threads, threadpool_count=threadpool_count,
                     numa_nodes=numa_nodes, method=method, cpu_save=cpu_save, **other)
        _report_no_effect({k: v for k, v in given.items() if v is not None})
        self._p2l = None  # EPLB's physical -> logical map, when not the identity
        self._owed_in = None  # (layer, n, Pending): the previous layer's deferred part
        super().__init__(layer_idx, num_experts, num_experts_per_tok, hidden_size,
                         moe_intermediate_size, gpu_experts_mask=mask,
                         weight_path=weight_path, chunked_prefill_size=chunked_prefill_size,
                         max_deferred_experts_per_token=max_deferred_experts_per_token or 0,
                         tp_rank=0, socket=os.environ.get("MOE_SIDECAR_SOCKET"), **given)
        self.max_deferred_experts_per_token = self.k_defer  # 0 on the last MoE layer
        self.k_defer = 0  # deferral is split here (select_deferred_experts), not by the sidecar
        self._check_swiglu(swiglu_limit, swiglu_alpha)
        m = torch.tensor(mask, dtype=torch.bool).as_subclass(_GpuExpertsMask)
        m._kt_owner = weakref.ref(self)
        self._mask_sent = torch.tensor(mask, dtype=torch.bool)
        self.gpu_experts_mask = m

    # ---- checks ---------------------------------------------------------------------------
    def _check_swiglu(self, limit, alpha):
        if limit is None and alpha is None:
            return
        st = self.client.stats()
        have_limit, have_alpha = st.get("swiglu_limit"), st.get("swiglu_alpha")
        served = self.client.info["model_name"]
        if have_limit is None:
            if (limit or 0) > 0:
                raise ValueError(f"swiglu_limit={limit}: the sidecar at "
                                 f"{self.client.socket_path} does not report its model's "
                                 "SwiGLU clamp (a sidecar older than this client); upgrade it")
            return
        if limit is not None and abs(float(limit) - have_limit) > 1e-6:
            raise ValueError(f"swiglu_limit={limit}, but the sidecar at "
                             f"{self.client.socket_path} serves {served} with "
                             + (f"swiglu_limit={have_limit:g}" if have_limit else
                                "plain SwiGLU (no clamp: swiglu_limit=0)"))
        if alpha is None:
            return
        ok = abs(float(alpha) - have_alpha) <= 1e-6 if have_limit else float(alpha) in (0.0, 1.0)
        if not ok:
            raise ValueError(f"swiglu_alpha={alpha}, but the sidecar at "
                             f"{self.client.socket_path} serves {served} with "
                             + (f"swiglu_alpha={have_alpha:g}" if have_limit else
                                "plain SwiGLU (silu(gate) * up: swiglu_alpha 0 or 1)"))

    # ---- weights ----------------------------------------------------------------------------
    def load_weights(self, physical_to_logical_map=None, *args, **kwargs):
        """Checks the served model against weight_path (nothing is loaded: the sidecar holds
        the weights) and takes EPLB's physical → logical expert map."""
        super().load_weights()
        if physical_to_logical_map is None:
            return
        E = self.num_experts
        p2l = [int(x) for x in torch.as_tensor(physical_to_logical_map).reshape(-1).tolist()]
        if len(p2l) != E:
            raise ValueError(f"physical_to_logical_map: {len(p2l)} physical experts, the "
                             f"layer has {E}: redundant experts (more physical than logical) "
                             "are not supported by moe-sidecar")
        seen = {}
        for p, lg in enumerate(p2l):
            if not 0 <= lg < E:
                raise ValueError(f"physical_to_logical_map: physical expert {p} maps to {lg}, "
                                 f"not a logical expert (0..{E - 1})")
            if lg in seen:
                raise ValueError(f"physical_to_logical_map: physical experts {seen[lg]} and "
                                 f"{p} are both logical expert {lg}: moe-sidecar serves each "
                                 "logical expert once (no redundant experts)")
            seen[lg] = p
        self._p2l = None if p2l == list(range(E)) else torch.tensor(p2l, dtype=torch.int64)
        if self.active:
            self._send_gpu_mask()

    def _mask_row(self):
        row = super()._mask_row()
        if self._p2l is None:
            return row
        out = [False] * self.num_experts
        for p, lg in enumerate(self._p2l.tolist()):
            out[lg] = row[p]
        return out

    def _cpu_ids(self, topk_ids):
        ids = super()._cpu_ids(topk_ids)  # the GPU's (physical) experts set to -1
        if self._p2l is None:
            return ids
        E = self.num_experts
        p2l = self._p2l.to(ids.device)
        real = (ids >= 0) & (ids < E)
        return torch.where(real, p2l[ids.clamp(0, E - 1).long()].to(ids.dtype), ids)

    # ---- the GPU mask at run time ---------------------------------------------------------
    def _sync_gpu_mask(self):
        """Sends gpu_experts_mask when it differs from what the sidecar was last sent."""
        m = self.__dict__.get("gpu_experts_mask")
        if m is None:
            return
        now = torch.as_tensor(m).as_subclass(torch.Tensor).to("cpu", torch.bool).reshape(-1)
        if torch.equal(now, self._mask_sent):
            return
        self.set_gpu_mask(now.tolist())
        self._mask_sent = now.clone()

    # ---- deferral ---------------------------------------------------------------------------
    def select_deferred_experts(self, expert_ids, expert_scores, protected_k):
        """kt-kernel's contract: (immediate_ids, deferred_ids) for expert_ids [n, k] (int64)
        and their scores, protecting each token's protected_k highest-scored. An engine may
        replace it on the wrapper (wrapper.select_deferred_experts = fn(ids, scores, k))."""
        return default_deferred_split(self.num_experts, expert_ids, expert_scores, protected_k)

    def submit_forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        self._sync_gpu_mask()
        defer = self.max_deferred_experts_per_token
        c = self.client
        # A part an engine's own selector deferred on the previous layer is added here.
        self._owed_in = c.__dict__.pop("_kt_owed", None) if c is not None else None
        if not defer or "select_deferred_experts" not in self.__dict__:
            # kt's own rule, applied by the sidecar (FWD_DEFER_UNION): one request, the same
            # on CPU tensors and on the CUDA stream path; the deferred part is added to the
            # next MoE layer's output by the sidecar.
            self.k_defer, self.defer_flags = defer, moe_sidecar.FWD_DEFER_UNION
            try:
                return super().submit_forward(hidden_states, topk_ids, topk_weights,
                                              cuda_stream)
            finally:
                self.k_defer, self.defer_flags = 0, 0
        if hidden_states.is_cuda:
            raise NotImplementedError(
                f"layer {self.layer_idx}: an engine's select_deferred_experts on CUDA "
                "tensors: moe-sidecar's stream path defers with kt's own rule only; "
                "remove the selector or set --kt-max-deferred-experts-per-token 0")
        # The engine's selector: its split, sent as two requests (the deferred one right
        # after, its output added to the next MoE layer's).
        n = int(hidden_states.shape[0])
        ids = topk_ids.to(torch.int64)
        deferred = None
        if n <= c.max_tokens:
            ids, deferred = self.select_deferred_experts(
                ids, topk_weights, self.num_experts_per_tok - defer)
        super().submit_forward(hidden_states, ids, topk_weights, cuda_stream)
        if deferred is not None:
            later = self._cpu_ids(deferred)
            if bool((later >= 0).any()):
                c._kt_owed = (self.layer_idx, n, c.forward_submit(
                    self.layer_idx, hidden_states, later, topk_weights, 0))

    def sync_forward(self, hidden_states, cuda_stream=None):
        out = super().sync_forward(hidden_states, cuda_stream)
        owed, self._owed_in = self._owed_in, None
        if owed is None:
            return out
        layer, n, pending = owed
        layers = self.client.moe_layers
        i = layers.index(self.layer_idx)
        if i > 0 and layers[i - 1] == layer and n == int(hidden_states.shape[0]):
            return out + pending.wait(self.timeout_ms)
        pending.abandon()  # owed by another pass (an aborted batch): not this layer's
        return out


__all__ = ["KTMoEWrapper"]
