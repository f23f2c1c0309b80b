"""KTMoEWrapper: a drop-in for kt-kernel's KTMoEWrapper, backed by a moe-sidecar process.

An engine that offloads experts with kt-kernel creates one wrapper per MoE layer and calls
submit_forward(hidden, topk_ids, topk_weights, cuda_stream) / sync_forward(hidden,
cuda_stream) (or forward). This class takes the same constructor keywords and calls, and sends
the work to the sidecar serving the same model instead of computing in the engine's process.

- All wrappers of one process share one channel (per socket), as kt's share one CPUInfer: a
  layer's deferred experts (max_deferred_experts_per_token) arrive in the next layer's output.
- Experts in the GPU mask (gpu_experts_mask, or the first num_gpu_experts) are the engine's:
  they are declared to the sidecar (never loaded for this client) and contribute nothing here.
- CUDA tensors take the stream path: the channel is registered with CUDA once; submit_forward
  copies activations, ids and weights device→slot on the given stream and enqueues a host
  function that submits; sync_forward enqueues one that waits, then copies slot→device on the
  stream. No host synchronisation, fixed addresses per batch size: CUDA-graph capturable.
  A failure inside a host function (which cannot raise) zeroes that layer's output and is
  raised by this wrapper's next call, or by check().
- A sidecar that dies or is restarted: the shared channel is reconnected by the next call
  after the one that failed (Client's auto_reconnect); each layer's request in flight then
  fails with PeerDeadError once (on the stream path at that wrapper's next call or check()),
  and so does a forward owed experts a layer deferred before the death. The stream path moves
  to the new mapping (registered again; captured CUDA graphs must be captured again). A
  wrapper made after a restart gets the reconnected channel.
- Tensor parallelism: only TP rank 0 talks to the sidecar; other ranks' sync_forward returns
  zeros, so the engine's all-reduce sums the CPU part once (as SGLang's kt wrapper does).
- chunked_prefill_size (the engine's prefill chunk) sizes the shared channel: the first
  wrapper of a socket asks for requests of that many tokens, granted up to `serve
  --max-tokens` (above it, the sidecar's limit; refused for memory, the default, 256).
  Batches above the channel's max_tokens are split into several requests.
- Accepted and documented without effect (the sidecar owns them: `moe-sidecar serve`):
  cpuinfer_threads, threadpool_count, numa_nodes, cpu_save, method.
- Everything after the five dimensions is keyword-only, as kt-kernel's callers pass it: the
  two classes order those parameters differently, and a positional call would fill the wrong
  ones silently.
- Expert ids are checked as Client.forward checks them: an integer dtype, and on the CPU path
  within int32; an id past num_experts (or negative but -1) is the sidecar's BadExpertError,
  with or without a GPU mask. The stream path cannot look at the ids without a host sync: it
  clamps them to int32 (an id that fits no expert stays one) and the sidecar refuses them.
"""

import os
import re

from .client import (DTYPE_BF16, DTYPE_F16, DTYPE_F32, FWD_DROP_DEFERRED, I32_MAX, I32_MIN,
                     MAX_TOKENS_LIMIT, U32_MAX, Client, _int, _is_integer, fingerprint)
from .errors import RefusedError, make_error

_SHARED = {}


# "max_tokens 4096 / top_k 8 above this sidecar's 1024 / 8 (serve --max-tokens)": the
# handshake grants only what was asked for, and its refusal is the one place a client learns
# the sidecar's --max-tokens (docs/protocol.md, §2 and §10).
_OFFERED = re.compile(r"above this sidecar's (\d+) / \d+ \(serve --max-tokens\)")


def _connect(socket, want_tokens, **kw):
    """A Client whose requests carry up to want_tokens tokens (an engine's chunked prefill
    size), or as many as the sidecar offers below that; else (a refusal for the channel's
    size: memory limit, --max-channel-mib) the default channel, whose limit the wrappers split
    batches by. A refusal the default channel meets too is raised."""
    if want_tokens:
        try:
            return Client(socket, max_tokens=want_tokens, **kw)
        except RefusedError as e:
            m = _OFFERED.search(e.message)
            offered = int(m.group(1)) if m else 0
            if 0 < offered < want_tokens:
                try:
                    return Client(socket, max_tokens=offered, **kw)
                except RefusedError:
                    pass
    return Client(socket, **kw)


def _chunk_tokens(chunked_prefill_size):
    """The max_tokens a wrapper asks for: the engine's chunked prefill size where it has one
    (SGLang's -1 or None: none), at most the protocol's limit; 0 asks for the default."""
    if chunked_prefill_size is None:
        return 0
    n = _int("chunked_prefill_size", chunked_prefill_size, -1, I32_MAX)
    return min(n, MAX_TOKENS_LIMIT) if n > 0 else 0


def shared_client(socket=None, timeout_ms=30000, server_uid=None, max_tokens=0):
    """The process's one Client per socket (created on first use, reconnected after a fork,
    and after its sidecar was seen gone or its socket hung up: a wrapper made after a restart
    never gets the dead channel). server_uid as Client's; one socket's wrappers must agree on
    it (their channel is one). max_tokens: what the first wrapper's channel asks for (0: the
    sidecar's default, 256 or its --max-tokens if lower), capped by what the sidecar offers;
    later wrappers share that channel, whatever they would have asked."""
    key = (socket, os.getpid())
    c = _SHARED.get(key)
    if c is None or c.closed:
        c = _connect(socket, max_tokens, n_slots=4, timeout_ms=timeout_ms,
                     name=f"kt-wrapper-{os.getpid()}", server_uid=server_uid)
        _SHARED[key] = c
    elif c.server_uid != server_uid:
        raise ValueError(f"server_uid={server_uid!r}: this process's channel to the sidecar "
                         f"was opened with server_uid={c.server_uid!r}")
    elif c._ch.hung_up():
        # What was in flight or owed still fails once (Client.reconnect says how); making a
        # wrapper is no batch of its own to fail.
        c.reconnect()
    return c


def _tp_rank(tp_rank):
    if tp_rank is not None:
        return _int("tp_rank", tp_rank)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return 0


class _StreamPath:
    """Per-channel state of the CUDA stream path: one slot kept for stream requests (stream
    order serialises them), its views as CUDA-registered tensors, and the host functions.
    Client.reconnect calls detach() before the mapping goes and attach() after."""

    def __init__(self, client):
        import torch

        from . import _native

        self.client = client
        self.rt = client.cuda_register()
        self.ops = {}  # op address -> its parameters after the slot (stream_op_set)
        self._take_slot()
        self.host_submit, self.host_wait = _native.host_functions()
        self.streams = {}
        self.torch = torch

    def _take_slot(self):
        c = self.client
        self.slot = c._ch.acquire()
        v = c.slot(self.slot)
        self.views = {
            "input": {d: v.input(n, torch=True) for d, n in
                      ((DTYPE_F32, "float32"), (DTYPE_F16, "float16"), (DTYPE_BF16, "bfloat16"))},
            "output": {d: v.output(n, torch=True) for d, n in
                       ((DTYPE_F32, "float32"), (DTYPE_F16, "float16"),
                        (DTYPE_BF16, "bfloat16"))},
            "ids": v.expert_ids(torch=True),
            "weights": v.expert_weights(torch=True),
        }

    def replace_slot(self):
        """After a timeout host_wait abandoned the stream slot (the sidecar may still write
        it): take another and point every stream op at it. Captured CUDA graphs keep the old
        slot's addresses: recapture them."""
        self._take_slot()
        for op, params in self.ops.items():
            self.client._ch.stream_op_set(op, self.slot, *params)

    def detach(self):
        """Before a reconnect: every stream this path used finishes what it holds of the old
        mapping (copies into and out of the slot, host functions — which fail at once on a
        dead channel), then the views of it are dropped (reconnect refuses while any lives,
        and cudaHostUnregister must not pull the memory from under a queued copy)."""
        for s in self.streams.values():
            s.synchronize()
        self.views = None

    def attach(self):
        """After a reconnect: a slot of the new channel (every slot is free again), its views
        in the newly registered mapping, and every stream op pointed at it."""
        self.replace_slot()

    def stream(self, handle):
        s = self.streams.get(handle)
        if s is None:
            s = self.torch.cuda.ExternalStream(handle) if handle else \
                self.torch.cuda.current_stream()
            self.streams[handle] = s
        return s


def _stream_path(client):
    """The client's stream path (kept on the client: its reconnect moves it)."""
    if client._stream_path is None:
        client._stream_path = _StreamPath(client)
    return client._stream_path


class KTMoEWrapper:
    """kt-kernel's KTMoEWrapper interface over a moe-sidecar. See the module's docstring."""

    _capture_batch_sizes = []

    def __init__(self, layer_idx, num_experts, num_experts_per_tok, hidden_size,
                 moe_intermediate_size, *, gpu_experts_mask=None, num_gpu_experts=None,
                 cpuinfer_threads=None, threadpool_count=None, numa_nodes=None,
                 weight_path=None, chunked_prefill_size=None, method=None,
                 max_deferred_experts_per_token=0, swiglu_limit=None, swiglu_alpha=None,
                 cpu_save=False, socket=None, tp_rank=None, timeout_ms=30000, server_uid=None,
                 **ignored):
        self.layer_idx = _int("layer_idx", layer_idx, 0, I32_MAX)
        self.num_experts = _int("num_experts", num_experts, 1, U32_MAX)
        self.num_experts_per_tok = _int("num_experts_per_tok", num_experts_per_tok, 1, U32_MAX)
        self.hidden_size = _int("hidden_size", hidden_size, 1, U32_MAX)
        self.moe_intermediate_size = _int("moe_intermediate_size", moe_intermediate_size, 1,
                                          U32_MAX)
        self.weight_path = weight_path
        self.chunked_prefill_size = chunked_prefill_size
        self.timeout_ms = _int("timeout_ms", timeout_ms)
        self.ignored = dict(cpuinfer_threads=cpuinfer_threads, threadpool_count=threadpool_count,
                            cpu_save=cpu_save, method=method, numa_nodes=numa_nodes,
                            swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha, **ignored)
        k_defer = _int("max_deferred_experts_per_token", max_deferred_experts_per_token or 0)
        if not 0 <= k_defer <= self.num_experts_per_tok:
            raise ValueError(f"max_deferred_experts_per_token={k_defer} not in "
                             f"0..{self.num_experts_per_tok} (num_experts_per_tok)")
        self.tp_rank = _tp_rank(tp_rank)
        self.active = self.tp_rank == 0
        self._pending = None
        self._ops = {}
        self._mask_t = None
        self._gpu_mask = self._mask_from(gpu_experts_mask, num_gpu_experts)
        # FORWARD flags sent with a deferring request: FWD_DEFER_UNION asks for kt-kernel's
        # deferral rule instead of the per-token one (kt_kernel's compatibility wrapper).
        self.defer_flags = 0
        if not self.active:
            self.client = None
            self.k_defer = 0
            return
        self.client = c = shared_client(socket, self.timeout_ms, server_uid,
                                        _chunk_tokens(chunked_prefill_size))
        i = c.info
        for field, want, have in (("num_experts", self.num_experts, i["n_experts"]),
                                  ("hidden_size", self.hidden_size, i["model_hidden"]),
                                  ("moe_intermediate_size", self.moe_intermediate_size,
                                   i["expert_ffn"]),
                                  ("num_experts_per_tok", self.num_experts_per_tok,
                                   i["model_top_k"])):
            if want != have:
                raise ValueError(f"{field}={want}, but the sidecar at {c.socket_path} serves "
                                 f"{i['model_name']} with {have}")
        if self.layer_idx not in i["moe_layers"]:
            raise ValueError(f"layer_idx={self.layer_idx} is not an MoE layer of the model the "
                             f"sidecar at {c.socket_path} serves (MoE layers "
                             f"{i['moe_layers'][0]}..{i['moe_layers'][-1]})")
        last = self.layer_idx == i["moe_layers"][-1]
        self.k_defer = 0 if last else k_defer
        self._send_gpu_mask()

    def _mask_row(self):
        """The sidecar's row of this layer's GPU mask, over the served model's expert ids."""
        return self._gpu_mask or [False] * self.num_experts

    def _send_gpu_mask(self):
        # This layer's row of the channel's mask is this wrapper's (none: every expert here).
        self.client.set_gpu_mask(self._mask_row(), layer=self.layer_idx)

    def set_gpu_mask(self, gpu_experts_mask):
        """Moves experts between the GPU and the sidecar while serving: gpu_experts_mask (bool
        per expert) replaces this layer's. The sidecar applies it in the channel's order
        (forwards sent before keep the old mask) and frees the experts now on the GPU; ids
        sent from now on are masked with it (on the stream path by a device tensor updated
        in place, so captured CUDA graphs use it too). The engine must hold an expert's
        weights on the GPU before it routes tokens there."""
        self._gpu_mask = self._mask_from(gpu_experts_mask, None)
        t = getattr(self, "_mask_t", None)
        if t is not None:
            import torch

            row = self._gpu_mask or [False] * self.num_experts
            t.copy_(torch.tensor(row, dtype=torch.bool), non_blocking=t.is_cuda)
        if self.active:
            self._send_gpu_mask()

    def _mask_from(self, gpu_experts_mask, num_gpu_experts):
        if gpu_experts_mask is not None and num_gpu_experts is not None:
            raise ValueError("gpu_experts_mask or num_gpu_experts, not both: the mask names "
                             "the GPU's experts, the count the first ones")
        if gpu_experts_mask is not None:
            m = gpu_experts_mask.tolist() if hasattr(gpu_experts_mask, "tolist") else \
                list(gpu_experts_mask)
            if len(m) != self.num_experts:
                raise ValueError(f"gpu_experts_mask: {len(m)} entries for {self.num_experts} "
                                 "experts")
            return [bool(x) for x in m]
        if num_gpu_experts:
            n = _int("num_gpu_experts", num_gpu_experts)
            if not 0 <= n <= self.num_experts:
                raise ValueError(f"num_gpu_experts={n} not in 0..{self.num_experts}")
            return [e < n for e in range(self.num_experts)]
        return None

    # ---- kt-kernel's class-level API ------------------------------------------------------
    @classmethod
    def set_capture_batch_sizes(cls, sizes):
        cls._capture_batch_sizes = sorted(int(s) for s in sizes)

    @classmethod
    def get_capture_batch_sizes(cls):
        return list(cls._capture_batch_sizes)

    @classmethod
    def clear_buffer_cache(cls):
        pass

    def load_weights(self, *args, **kwargs):
        """Loads nothing (the sidecar serves the weights): checks that the sidecar serves the
        model at weight_path, by fingerprint. Refuses another model with RefusedError."""
        if not self.active or not self.weight_path:
            return
        want = fingerprint(self.weight_path)
        have = self.client.fingerprint
        if want != have:
            raise RefusedError(-6, f"weight_path {self.weight_path} is model {want}, but the "
                                   f"sidecar at {self.client.socket_path} serves "
                                   f"{self.client.info['model_name']} {have}")

    def load_weights_from_tensors(self, *args, **kwargs):
        raise NotImplementedError("moe-sidecar reads the model's files itself: start "
                                  "`moe-sidecar serve MODEL` and call load_weights()")

    # ---- forward ------------------------------------------------------------------------
    def _cpu_ids(self, topk_ids):
        """topk_ids with this layer's GPU experts set to -1 (skip), on their device, without a
        host sync. Ids of no expert are left for the sidecar to refuse."""
        import torch

        if not _is_integer(topk_ids):
            raise ValueError(f"topk_ids: dtype {topk_ids.dtype} is not an integer type")
        # Signed and wide enough for -1 and any id (a no-op for kt's int64 and for int32).
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int64)
        if self._gpu_mask is not None:
            if self._mask_t is None or self._mask_t.device != ids.device:
                self._mask_t = torch.tensor(self._gpu_mask, dtype=torch.bool, device=ids.device)
            E = self.num_experts
            on_gpu = self._mask_t[ids.clamp(0, E - 1).long()] & (ids >= 0) & (ids < E)
            ids = torch.where(on_gpu, torch.full_like(ids, -1), ids)
        return ids

    def check(self):
        """Raises the first failure a stream host function recorded (after the stream ran)."""
        if not self.active:
            return
        for op in self._ops.values():
            status, message, value, index = self.client._ch.stream_op_take(op)
            if status != 0:
                if status == -9:  # ETIMEDOUT: the stream slot was abandoned
                    _stream_path(self.client).replace_slot()
                raise make_error(status, f"layer {self.layer_idx}: {message}", value, index)

    def submit_forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        if not self.active:
            return
        if self._pending is not None:
            raise RuntimeError(f"layer {self.layer_idx}: submit_forward twice without "
                               "sync_forward")
        n = int(hidden_states.shape[0])
        if hidden_states.is_cuda:
            self._submit_stream(hidden_states, topk_ids, topk_weights, cuda_stream, n)
            return
        ids = self._cpu_ids(topk_ids)
        if n > self.client.max_tokens:
            self._pending = ("chunks", self.client.forward(self.layer_idx, hidden_states, ids,
                                                           topk_weights, 0))
            return
        self._pending = ("cpu", self.client.forward_submit(
            self.layer_idx, hidden_states, ids, topk_weights, self.k_defer,
            self.defer_flags if self.k_defer else 0))

    def sync_forward(self, hidden_states, cuda_stream=None):
        import torch

        if not self.active:
            return torch.zeros_like(hidden_states)
        p, self._pending = self._pending, None
        if p is None:
            raise RuntimeError(f"layer {self.layer_idx}: sync_forward without submit_forward")
        if p[0] == "cpu":
            return p[1].wait(self.timeout_ms)
        if p[0] == "chunks":
            return p[1]
        return self._sync_stream(hidden_states, cuda_stream, p)

    def forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        self.submit_forward(hidden_states, topk_ids, topk_weights, cuda_stream)
        return self.sync_forward(hidden_states, cuda_stream)

    # ---- the CUDA stream path ----------------------------------------------------------------
    def _op(self, sp, n, k, k_defer, dtype, flags):
        key = (n, k, k_defer, dtype, flags)
        op = self._ops.get(key)
        if op is None:
            op = self.client._ch.stream_op()
            params = (self.layer_idx, n, k, k_defer, dtype, dtype, flags, self.timeout_ms)
            self.client._ch.stream_op_set(op, sp.slot, *params)
            sp.ops[op] = params
            self._ops[key] = op
        return op

    def _submit_stream(self, hidden_states, topk_ids, topk_weights, cuda_stream, n):
        import torch

        from .client import _dtype_code

        # A channel found dead is reconnected first: that waits for the streams, so every
        # failure of this wrapper's earlier work is recorded by then and raised by check().
        self.client._recover()
        self.check()  # an earlier layer's failure surfaces here
        sp = _stream_path(self.client)
        H = self.client.hidden
        if int(hidden_states.shape[1]) != H:
            raise ValueError(f"hidden_states: shape {tuple(hidden_states.shape)}, want "
                             f"[n_tokens, {H}]")
        dtype = _dtype_code(hidden_states, "hidden_states")
        k = int(topk_ids.shape[1])
        stream = sp.stream(cuda_stream if cuda_stream is not None else
                           torch.cuda.current_stream(hidden_states.device).cuda_stream)
        chunk = self.client.max_tokens
        k_defer = self.k_defer if n <= chunk else 0
        parts = []
        with torch.cuda.stream(stream):
            # Clamped, not wrapped, into the int32 slot: an id of no expert stays one.
            ids = self._cpu_ids(topk_ids).clamp(I32_MIN, I32_MAX).to(torch.int32)
            w = topk_weights.to(torch.float32)
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                m = e - s
                op = self._op(sp, m, k, k_defer, dtype,
                              self.defer_flags if k_defer else 0)
                # Each chunk is copied in, submitted, waited and copied out in stream order;
                # only the last chunk's wait is left to sync_forward.
                sp.views["input"][dtype][: m * H].view(m, H).copy_(hidden_states[s:e],
                                                                   non_blocking=True)
                sp.views["ids"][: m * k].view(m, k).copy_(ids[s:e], non_blocking=True)
                sp.views["weights"][: m * k].view(m, k).copy_(w[s:e], non_blocking=True)
                sp.rt.launch_host_func(stream.cuda_stream, sp.host_submit, op)
                if e < n:
                    out = self._collect_stream(sp, stream, op, m, dtype, hidden_states.device)
                    parts.append(out)
                else:
                    last = (op, m, dtype)
        self._pending = ("stream", parts, last, stream)

    def _collect_stream(self, sp, stream, op, m, dtype, device):
        import torch

        sp.rt.launch_host_func(stream.cuda_stream, sp.host_wait, op)
        H = self.client.hidden
        out = torch.empty((m, H), dtype=sp.views["output"][dtype].dtype, device=device)
        out.copy_(sp.views["output"][dtype][: m * H].view(m, H), non_blocking=True)
        return out

    def _sync_stream(self, hidden_states, cuda_stream, p):
        import torch

        _, parts, (op, m, dtype), stream = p
        sp = _stream_path(self.client)
        # The wait and the copy out go on the stream sync_forward is given (kt's contract:
        # the result is ready in that stream's order). When it is not the one submit_forward
        # used, it first waits for that one (an event: no host sync, capturable).
        if cuda_stream is not None and sp.stream(cuda_stream).cuda_stream != stream.cuda_stream:
            target = sp.stream(cuda_stream)
            target.wait_stream(stream)
            for t in parts:  # made on the submit stream, used on the target's
                t.record_stream(target)
            stream = target
        with torch.cuda.stream(stream):
            parts.append(self._collect_stream(sp, stream, op, m, dtype, hidden_states.device))
            return parts[0] if len(parts) == 1 else torch.cat(parts)


__all__ = ["KTMoEWrapper", "shared_client"]
