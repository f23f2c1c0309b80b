"""moe_sidecar.Client: one channel to a running `moe-sidecar serve`, for numpy and torch.

Hidden states are [n_tokens, hidden] rows of float32, float16 or bfloat16 — numpy arrays
(bfloat16 through ml_dtypes, when installed) or torch tensors on any device (CUDA tensors are
copied through the channel synchronously here; KTMoEWrapper has the stream-ordered path).
Expert ids are [n_tokens, k] integers (-1 = skip), weights [n_tokens, k] floats. Results come
back in the input's type, dtype and device.

The slot areas are exposed without copies: Client.slot(i).input(...) and friends are numpy or
torch views of the shared mapping. close() refuses while such views are alive (as mmap does).

Integer arguments are anything with __index__ (Python's, numpy's, a 0-d torch integer
tensor), never a float; one that does not fit the field it fills is refused with OverflowError
naming the argument, the value and the range, not wrapped into it. Expert ids must be an
integer array; one that does not fit int32 is refused with ValueError.

When the sidecar dies or is restarted: the call that finds it gone raises PeerDeadError (a
request in flight then fails with it, each once), and the next call reconnects first (within
connect_timeout_ms) to the sidecar then serving the socket, which must serve the same model
(RefusedError otherwise; the call after tries again). See Client.reconnect.

Not thread-safe beyond what the C extension serialises: one Client per engine thread, or a
lock around it.
"""

import json
import struct

from . import _native
from .errors import InvalidError, PeerDeadError, TimeoutError, make_error

_native._set_error_factory(make_error)

DTYPE_F32, DTYPE_F16, DTYPE_BF16 = _native.DTYPE_F32, _native.DTYPE_F16, _native.DTYPE_BF16
FWD_DROP_DEFERRED = _native.FWD_DROP_DEFERRED
FWD_DEFER_COLD = _native.FWD_DEFER_COLD
FWD_DEFER_UNION = _native.FWD_DEFER_UNION
MAX_TOKENS_LIMIT = _native.MAX_TOKENS_LIMIT  # the most max_tokens a channel may ask for
_ITEMSIZE = {DTYPE_F32: 4, DTYPE_F16: 2, DTYPE_BF16: 2}
I32_MIN, I32_MAX, U32_MAX = -2**31, 2**31 - 1, 2**32 - 1


def _int(name, value, lo=I32_MIN, hi=I32_MAX):
    """value as an int, or the TypeError/OverflowError every native argument raises."""
    return _native.int_arg(name, value, lo, hi)

def fingerprint(path):
    """The model fingerprint (32 hex digits) of a model path, as a sidecar serving it reports."""
    return _native.fingerprint(str(path))


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _dtype_code(x, what):
    """The wire dtype of an array or tensor of activations."""
    if _is_torch(x):
        t = _torch()
        table = {t.float32: DTYPE_F32, t.float16: DTYPE_F16, t.bfloat16: DTYPE_BF16}
        code = table.get(x.dtype)
    else:
        name = getattr(getattr(x, "dtype", None), "name", None)
        code = {"float32": DTYPE_F32, "float16": DTYPE_F16, "bfloat16": DTYPE_BF16}.get(name)
    if code is None:
        raise ValueError(
            f"{what}: dtype {getattr(x, 'dtype', type(x).__name__)} is not one of "
            "float32, float16, bfloat16"
        )
    return code


def _is_integer(x):
    if _is_torch(x):
        return not x.is_floating_point() and not x.is_complex() and x.dtype != _torch().bool
    return getattr(getattr(x, "dtype", None), "kind", "") in "iu"


def _is_floating(x):
    if _is_torch(x):
        return x.is_floating_point()
    return getattr(getattr(x, "dtype", None), "kind", "") == "f"


def _shape(x):
    return tuple(int(d) for d in x.shape)


_FITS_INT32 = {"int8", "int16", "int32", "uint8", "uint16"}


def _check_ids_fit(ids, n_experts):
    """Expert ids cross as int32: a wider one would wrap into another expert (2**40 → 0) or
    into -1 (2**64 - 1 → skipped). The ids are read once more only when their dtype is wider
    (a CUDA tensor: a synchronisation, as the copy through the channel is anyway)."""
    dtype = str(ids.dtype).replace("torch.", "")
    if dtype in _FITS_INT32 or (I32_MIN <= int(ids.min()) and int(ids.max()) <= I32_MAX):
        return
    for t, row in enumerate(ids.tolist()):
        for v in row:
            if not I32_MIN <= v <= I32_MAX:
                raise ValueError(f"ids: token {t}: {v} is not an expert id "
                                 f"(0..{n_experts - 1}, -1 = skip)")


class Pending:
    """A FORWARD in flight on one slot: wait() or poll() for its output."""

    def __init__(self, client, slot, n_tokens, like, out):
        self._client, self.slot, self.n_tokens = client, slot, n_tokens
        self._like, self._out = like, out
        self.n_deferred = None
        self._generation = client._ch.generation  # the channel it was sent on
        self._seq = client._fwd_seq

    def _check_channel(self):
        """A request of a channel since replaced died with its sidecar: its slot index now
        names another request's slot, so it is never touched."""
        c = self._client
        if self._generation != c._ch.generation:
            raise PeerDeadError(-8, f"{c.socket_path}: the sidecar this request was sent to "
                                    "died; the channel has been reconnected since")

    def wait(self, timeout_ms=None):
        """The output, waiting at most timeout_ms (default: the client's). A TimeoutError
        leaves the request in flight: wait again, or abandon()."""
        c = self._client
        t = c.timeout_ms if timeout_ms is None else _int("timeout_ms", timeout_ms)
        self._check_channel()
        try:
            self.n_deferred = c._ch.wait(self.slot, t)
        except Exception as e:
            if not isinstance(e, TimeoutError):  # a timeout leaves it collectable
                c._give_back(self.slot)
            raise
        return self._finish()

    def poll(self):
        """The output if the request completed, else None."""
        self._check_channel()
        try:
            v = self._client._ch.wait(self.slot, 0, True)
        except Exception:
            self._client._give_back(self.slot)
            raise
        if v is None:
            return None
        self.n_deferred = v
        return self._finish()

    def abandon(self):
        """Gives the request up; its slot comes back when its completion arrives."""
        if self._generation == self._client._ch.generation:
            self._client._ch.release(self.slot, True)

    def _finish(self):
        c = self._client
        if self.n_deferred and self._seq == c._fwd_seq:
            c._owed = True  # the sidecar owes these experts to the next forward
        try:
            return c._read_output(self.slot, self.n_tokens, self._like, self._out)
        finally:
            c._ch.release(self.slot)


class SlotView:
    """Zero-copy views of one slot's areas (numpy, or torch with torch=True)."""

    def __init__(self, client, index):
        self._c, self.index = client, index
        self.layout = client._layout[index]

    def _view(self, area, dtype, torch):
        off, nbytes = self.layout[area]
        buf = self._c._ch.area(off, nbytes)
        if torch:
            t = _torch()
            tdt = {"float32": t.float32, "float16": t.float16, "bfloat16": t.bfloat16,
                   "int32": t.int32}[dtype]
            return t.frombuffer(buf, dtype=tdt)
        import numpy as np

        if dtype == "bfloat16":
            import ml_dtypes

            return np.frombuffer(buf, dtype=ml_dtypes.bfloat16)
        return np.frombuffer(buf, dtype=dtype)

    def input(self, dtype="float32", torch=False):
        return self._view("input", dtype, torch)

    def output(self, dtype="float32", torch=False):
        return self._view("output", dtype, torch)

    def expert_ids(self, torch=False):
        return self._view("ids", "int32", torch)

    def expert_weights(self, torch=False):
        return self._view("weights", "float32", torch)


PLACEMENT_STRATEGIES = ("frequency", "uniform", "front-loading", "balanced")


def placement(load, gpu_experts, strategy="frequency", blocks=None, n_blocks=None):
    """GPU expert placement (moe_placement in libmoe_client): load is [n_moe_layers][n_experts]
    non-negative (counts or heat; a nested list, numpy array or torch tensor); gpu_experts the
    budget; strategy one of PLACEMENT_STRATEGIES; blocks the transformer block of each MoE
    layer (None: layer i = block i) and n_blocks the mask's rows (default: the last block + 1).
    Returns {"strategy", "covered" (the chosen experts' share of the load), "coverage" (every
    strategy's on the same load), "mask" (bytes for set_gpu_mask(mask, -1)),
    "gpu_experts_mask" ([n_blocks][n_experts] bools: kt-kernel's shape)}."""
    import array

    if strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(f"placement: strategy {strategy!r}: one of "
                         f"{', '.join(PLACEMENT_STRATEGIES)}")
    rows = load.tolist() if hasattr(load, "tolist") else [list(r) for r in load]
    if not rows or not rows[0]:
        raise ValueError("placement: load is empty")
    L, E = len(rows), len(rows[0])
    if any(len(r) != E for r in rows):
        raise ValueError("placement: load rows differ in length")
    flat = array.array("d", [float(x) for r in rows for x in r])
    b = None
    if blocks is not None:
        blocks = [_int("blocks", x) for x in blocks]
        if len(blocks) != L:
            raise ValueError(f"placement: {len(blocks)} blocks for {L} layers")
        b = array.array("i", blocks)
    if n_blocks is None:
        n_blocks = (blocks[-1] + 1) if blocks else L
    n_blocks = _int("n_blocks", n_blocks, 0, U32_MAX)
    coverage = {}
    chosen = None
    for i, name in enumerate(PLACEMENT_STRATEGIES):
        mask, covered = _native.placement(flat, L, E, b, n_blocks, gpu_experts, i)
        coverage[name] = covered
        if name == strategy:
            chosen = mask
    row = (E + 7) // 8
    bools = [[bool(chosen[r * row + e // 8] >> (e % 8) & 1) for e in range(E)]
             for r in range(n_blocks)]
    return {"strategy": strategy, "covered": coverage[strategy], "coverage": coverage,
            "mask": bytes(chosen), "gpu_experts_mask": bools}



# struct moe_lease_matrix (moe_abi.h): offset, bytes, row_stride, scales_offset, bias_offset
# (u64), format, rows, cols, interleave, scale_stride, reserved (u32); struct moe_lease_expert:
# lease, layer, expert, activation (u32/i32) then gate, up, down.
_LEASE_MATRIX = struct.Struct("<5Q6I")
# struct moe_lease_slice (ABI 1.4): offset, bytes, row_stride, scales_offset, bias_offset
# (u64), pool, row0, rows, interleave, scale_stride, n_slices (u32)
_LEASE_SLICE = struct.Struct("<5Q6I")
_AREA_STAGING = 1
_AREA_SLICES = 2
_LEASE_EXPERT = struct.Struct("<IiII")
_LEASE_EXPERT_BYTES = _LEASE_EXPERT.size + 3 * _LEASE_MATRIX.size
_MATRICES = ("gate", "up", "down")
_NO_OFFSET = (1 << 64) - 1
_BF16 = 30  # the kernels' (GGUF's) BF16 id
_F32 = 0
_F16 = 1
# (elements, bytes) per block of each format id: facts of the formats (GGUF, and the
# sidecar's FP8_E4M3_B128 1000 and INT4_G32 1001)
_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 10: (256, 84), 11: (256, 110),
           12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136),
           30: (1, 2), 39: (32, 17), 1000: (1, 1), 1001: (32, 20)}


class Lease:
    """Experts of one layer pinned in the sidecar's shared slot pool (Client.lease). The pool
    is mapped read-only and shared by every lease of the client; views are zero-copy.

    experts: the expert ids, in order. matrices[i][name] (name gate, up, down): the
    description (offset, bytes, row_stride, format, rows, cols, interleave, ...). views():
    per expert a dict of torch uint8 tensors over the mapping — rows x row bytes at the
    row stride for the files' rows (interleave 0); the whole span for the decode layout
    (interleave 8: rows() gives GGUF rows); for a dtype="bf16" lease, bfloat16 rows x cols
    tensors of the channel's staging area. On a sidecar that splits experts over NUMA nodes
    (one pool per node) a raw matrix has area 2 and "slices" (per node: pool, row0, rows,
    offset, ...): its view is a list of one such tensor per slice, over that node's pool
    (Client.lease_pool(pool=k)); rows() gathers the whole matrix. rows(i, name): the GGUF rows of one matrix (a
    copy; BF16/F16/F32 as rows x cols of that dtype, other formats as uint8 rows x row bytes).
    The mapping is read-only: writing into a view faults the process. A view taken before
    release() still reads the mapping (kept alive), but what it shows may change once the
    expert is evicted: views after release() are refused, and so is everything after the
    sidecar restarted (PeerDeadError)."""

    def __init__(self, client, layer, raw, pool, generation):
        self._client = client
        self.layer = layer
        self._pool = pool
        self._generation = generation
        self.ids = []
        self.experts = []
        self.matrices = []
        for at in range(0, len(raw), _LEASE_EXPERT_BYTES):
            lease_id, _layer, expert, activation = _LEASE_EXPERT.unpack_from(raw, at)
            ms = {}
            for j, name in enumerate(_MATRICES):
                o = at + _LEASE_EXPERT.size + j * _LEASE_MATRIX.size
                f = _LEASE_MATRIX.unpack_from(raw, o)
                ms[name] = {"offset": f[0], "bytes": f[1], "row_stride": f[2],
                            "scales_offset": None if f[3] == _NO_OFFSET else f[3],
                            "bias_offset": None if f[4] == _NO_OFFSET else f[4],
                            "format": f[5], "rows": f[6], "cols": f[7], "interleave": f[8],
                            "scale_stride": f[9], "area": f[10],
                            "_raw": bytes(raw[o:o + _LEASE_MATRIX.size])}
                if f[10] == _AREA_SLICES:
                    sr = client._ch.lease_slices(bytes(raw[at:at + _LEASE_EXPERT_BYTES]), j)
                    ms[name]["slices"] = [
                        dict(zip(("offset", "bytes", "row_stride", "scales_offset",
                                  "bias_offset", "pool", "row0", "rows", "interleave",
                                  "scale_stride", "n_slices"),
                                 _LEASE_SLICE.unpack_from(sr, k)),
                             _raw=bytes(sr[k:k + _LEASE_SLICE.size]))
                        for k in range(0, len(sr), _LEASE_SLICE.size)]
            self.ids.append(lease_id)
            self.experts.append(expert)
            self.matrices.append(ms)
        self.activation = activation if self.ids else 0
        self.released = False

    def _check(self):
        if self.released:
            raise InvalidError(-1, "the lease was released: its views are gone")
        if self._client._ch.dead or self._client.generation != self._generation:
            raise PeerDeadError(-8, "the sidecar that granted this lease is gone")

    @staticmethod
    def _row_bytes(m):
        be, bb = _BLOCKS.get(m["format"], (1, 1))
        return m["cols"] // be * bb

    def views(self):
        """Per expert {gate, up, down}: torch uint8 tensors over the read-only mapping."""
        self._check()
        torch = _torch()
        import warnings

        out = []
        flats = {}

        def flat_of(k):  # pool k's mapping as a flat uint8 tensor
            if k not in flats:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the buffer is read-only, on purpose
                    flats[k] = torch.frombuffer(self._pool if k is None else self._pool_at(k),
                                                dtype=torch.uint8)
            return flats[k]

        def view(flat, m, s):  # rows of m held by s (offset, bytes, rows) over flat
            if s["interleave"]:
                return flat[s["offset"]:s["offset"] + s["bytes"]]
            return flat[s["offset"]:].as_strided((s["rows"], self._row_bytes(m)),
                                                 (s["row_stride"], 1))

        for ms in self.matrices:
            d = {}
            for name, m in ms.items():
                if m["area"] == _AREA_STAGING:  # staging: BF16 rows, packed
                    d[name] = flat_of(None)[m["offset"]:m["offset"] + m["bytes"]].view(
                        torch.bfloat16).view(m["rows"], m["cols"])
                elif m["area"] == _AREA_SLICES:
                    d[name] = [view(flat_of(s["pool"]), m, s) for s in m["slices"]]
                else:
                    d[name] = view(flat_of(None), m, m)
            out.append(d)
        return out

    def _pool_at(self, k):
        return self._client.lease_pool(pool=k)

    def rows(self, i, name):
        """GGUF rows of matrix `name` of the i-th expert, as a new tensor: BF16, F16 and F32
        as rows x cols of that dtype, other formats as uint8 rows x row bytes."""
        self._check()
        if name not in _MATRICES:
            raise ValueError(f"rows: {name!r}: gate, up or down")
        m = self.matrices[i][name]
        torch = _torch()
        if m["format"] not in _BLOCKS:
            raise ValueError(f"rows: format {m['format']} unknown to this binding")
        be, bb = _BLOCKS[m["format"]]
        rb = m["cols"] // be * bb
        out = bytearray(m["rows"] * rb)
        if m["area"] == _AREA_SLICES:
            for s in m["slices"]:
                _native.deinterleave_slice(m["_raw"], s["_raw"], self._pool_at(s["pool"]), out)
        else:
            _native.deinterleave(m["_raw"], self._pool, out)
        t = torch.frombuffer(out, dtype=torch.uint8).reshape(m["rows"], rb)
        dt = {_BF16: torch.bfloat16, _F16: torch.float16, _F32: torch.float32}.get(m["format"])
        return t.view(dt) if dt is not None else t

    def release(self, timeout_ms=None):
        """Lets the experts go (idempotent). After a restart there is nothing to release."""
        if self.released:
            return
        self.released = True
        c = self._client
        if c._ch.dead or c.generation != self._generation or c.closed:
            return
        t = c.timeout_ms if timeout_ms is None else timeout_ms
        c._ch.lease_release(struct.pack(f"<{len(self.ids)}I", *self.ids), t)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self.released else "held"
        return f"<Lease layer {self.layer}, {len(self.ids)} experts, {state}>"


class Client:
    """A connection to `moe-sidecar serve`. See the module's docstring.

    socket: the sidecar's socket (default as libmoe_client: $MOE_SIDECAR_SOCKET, ...); the
    one connected to is socket_path.
    max_tokens/top_k/n_slots: channel limits (0: the sidecar's defaults). timeout_ms: default
    wait for each request. connect_timeout_ms: how long connecting may wait for a sidecar that
    is starting (the socket not there yet, or warming up), retried with a bounded backoff;
    0: not at all — ConnectError if nothing serves the path, StartingError (a ConnectError)
    with the warm-up progress if a sidecar is there but not serving yet. expect_model: a fingerprint (or, with model_path, computed from it)
    the served model must have. server_uid: the uid the sidecar may run as besides root and
    this process's own (None: only those two). The server's uid is read from the socket
    (SO_PEERCRED) before anything is sent; any other is refused with RefusedError naming both
    uids, so a socket path another user could redirect never leads to that user's server.
    auto_reconnect: after a call found the sidecar gone (and raised PeerDeadError), the next
    call reconnects first (reconnect()); False: every call raises until reconnect() is called.
    batch_invariant: every forward on this channel gives a token the same bits whatever else
    is in the batch (its size, the token's position, the other tokens); a sidecar that cannot
    promise it refuses the connection. Client.batch_invariant says what was granted.
    """

    def __init__(self, socket=None, *, max_tokens=0, top_k=0, n_slots=4, timeout_ms=30000,
                 connect_timeout_ms=5000, name="moe_sidecar.py", expect_model=None,
                 model_path=None, server_uid=None, auto_reconnect=True,
                 batch_invariant=False):
        if model_path is not None:
            expect_model = fingerprint(model_path)
        self.socket = socket
        self.timeout_ms = _int("timeout_ms", timeout_ms)
        self.server_uid = server_uid
        self.connect_timeout_ms = _int("connect_timeout_ms", connect_timeout_ms, 0)
        self.auto_reconnect = bool(auto_reconnect)
        self._ch = _native.Channel(socket, max_tokens, 0, top_k, n_slots,
                                   self.connect_timeout_ms or _native.CONNECT_NOWAIT, name,
                                   expect_model, server_uid, bool(batch_invariant))
        self._refresh()
        self._cuda_registered = None  # (runtime, address) while the mapping is registered
        self._cuda_wanted = False     # registered again after a reconnect
        self._stream_path = None      # kt's stream path: holds views of the mapping
        # Deferral across a reconnect: _owed while the last FORWARD completed having deferred
        # experts into the next one; a reconnect loses them, and the next forward must fail.
        self._fwd_seq = 0
        self._owed = False
        self._lost_deferred = False

    def _refresh(self):
        """What the channel negotiated, read again (after connect and each reconnect)."""
        self.info = self._ch.info()
        self.socket_path = self.info["socket_path"]
        self._layout = [self._ch.slot_layout(i) for i in range(self.info["n_slots"])]

    # ---- what is served ------------------------------------------------------------------
    @property
    def hidden(self):
        return self.info["hidden"]

    @property
    def max_tokens(self):
        return self.info["max_tokens"]

    @property
    def top_k(self):
        return self.info["top_k"]

    @property
    def n_experts(self):
        return self.info["n_experts"]

    @property
    def moe_layers(self):
        return list(self.info["moe_layers"])

    @property
    def fingerprint(self):
        return self.info["fingerprint"]

    @property
    def batch_invariant(self):
        """Whether this channel's forwards are batch-invariant (asked, or --batch-invariant)."""
        return self.info["batch_invariant"]

    @property
    def closed(self):
        return self._ch.closed

    @property
    def generation(self):
        """1 after connect, +1 per reconnect: the channel's memory (region(), slot views,
        CUDA graphs captured on them) belongs to one generation."""
        return self._ch.generation

    def region(self):
        """(address, bytes) of the channel's shared mapping (for cudaHostRegister)."""
        return self._ch.region()

    def slot(self, index):
        """Zero-copy views of slot `index` (see SlotView)."""
        index = _int("index", index)
        if not 0 <= index < len(self._layout):
            raise ValueError(f"slot {index} out of range (0..{len(self._layout) - 1})")
        return SlotView(self, index)

    # ---- requests --------------------------------------------------------------------------
    def _check_forward_args(self, layer, hidden, ids, weights, k_defer):
        """(layer, n_tokens, k, k_defer), the integers as ints; or why not."""
        layer = _int("layer", layer)
        k_defer = _int("k_defer", k_defer, 0, U32_MAX)
        if layer not in self.info["moe_layers"]:
            raise ValueError(
                f"layer: {layer} is not an MoE layer of the served model "
                f"({self.info['model_name']}: {self.info['moe_layers'][:8]}...)"
            )
        hs, is_, ws = _shape(hidden), _shape(ids), _shape(weights)
        if len(hs) != 2 or hs[1] != self.hidden:
            raise ValueError(f"hidden: shape {hs}, want [n_tokens, {self.hidden}]")
        n = hs[0]
        if n == 0:
            raise ValueError("hidden: no tokens")
        if len(is_) != 2 or is_[0] != n:
            raise ValueError(f"ids: shape {is_}, want [{n}, k]")
        k = is_[1]
        if not 1 <= k <= self.top_k:
            raise ValueError(f"ids: k = {k} ids per token, the channel takes 1..{self.top_k}")
        if ws != is_:
            raise ValueError(f"weights: shape {ws}, want {is_} like ids")
        if not _is_integer(ids):
            raise ValueError(f"ids: dtype {ids.dtype} is not an integer type")
        if not _is_floating(weights):
            raise ValueError(f"weights: dtype {weights.dtype} is not a floating type")
        if not 0 <= k_defer <= k:
            raise ValueError(f"k_defer: {k_defer} not in 0..{k}")
        _check_ids_fit(ids, self.n_experts)
        return layer, n, k, k_defer

    def _write_inputs(self, slot, hidden, ids, weights, n, k):
        v = SlotView(self, slot)
        code = _dtype_code(hidden, "hidden")
        dname = {DTYPE_F32: "float32", DTYPE_F16: "float16", DTYPE_BF16: "bfloat16"}[code]
        H = self.hidden
        if _is_torch(hidden):
            t = _torch()
            v.input(dname, torch=True)[: n * H].view(n, H).copy_(hidden)
            v.expert_ids(torch=True)[: n * k].view(n, k).copy_(t.as_tensor(ids).to(t.int32))
            v.expert_weights(torch=True)[: n * k].view(n, k).copy_(
                t.as_tensor(weights).to(t.float32))
        else:
            import numpy as np

            v.input(dname)[: n * H].reshape(n, H)[...] = hidden
            v.expert_ids()[: n * k].reshape(n, k)[...] = np.asarray(ids).astype(np.int32)
            v.expert_weights()[: n * k].reshape(n, k)[...] = np.asarray(weights, np.float32)
        return code

    def _read_output(self, slot, n, like, out):
        v = SlotView(self, slot)
        code = _dtype_code(like, "hidden")
        dname = {DTYPE_F32: "float32", DTYPE_F16: "float16", DTYPE_BF16: "bfloat16"}[code]
        H = self.hidden
        if _is_torch(like):
            src = v.output(dname, torch=True)[: n * H].view(n, H)
            if out is None:
                return src.to(like.device, copy=True)
            out.copy_(src)
            return out
        src = v.output(dname)[: n * H].reshape(n, H)
        if out is None:
            return src.copy()
        out[...] = src
        return out

    def _give_back(self, slot):
        try:
            self._ch.release(slot, True)
        except Exception:
            pass

    def forward_submit(self, layer, hidden, ids, weights, k_defer=0, flags=0, out=None):
        """Starts one MoE layer (at most max_tokens tokens) and returns a Pending at once."""
        layer, n, k, k_defer = self._check_forward_args(layer, hidden, ids, weights, k_defer)
        if n > self.max_tokens:
            raise ValueError(f"hidden: {n} tokens, a request takes at most {self.max_tokens} "
                             "(forward() splits bigger batches)")
        self._recover()
        if self._lost_deferred:
            self._lost_deferred = False
            if not flags & FWD_DROP_DEFERRED:
                raise PeerDeadError(-8, f"{self.socket_path}: the sidecar died owing this "
                                        "forward the experts the previous one deferred; the "
                                        "channel was reconnected, but this batch is lost")
        self._fwd_seq += 1
        self._owed = False
        slot = self._ch.acquire()
        try:
            code = self._write_inputs(slot, hidden, ids, weights, n, k)
            self._ch.submit(slot, layer, n, k, k_defer, code, code, flags)
        except BaseException:
            self._give_back(slot)
            raise
        return Pending(self, slot, n, hidden, out)

    def forward(self, layer, hidden, ids, weights, k_defer=0, flags=0, out=None,
                timeout_ms=None):
        """One MoE layer: Σ w·expert(x) over each token's ids, in hidden's type and dtype.
        Batches above max_tokens are split (only without k_defer). k_defer: ids per token the
        sidecar may defer into the NEXT forward on this client (0 on the last MoE layer)."""
        layer, n, k, k_defer = self._check_forward_args(layer, hidden, ids, weights, k_defer)
        if timeout_ms is not None:  # refused before anything is submitted
            timeout_ms = _int("timeout_ms", timeout_ms)
        if n <= self.max_tokens:
            p = self.forward_submit(layer, hidden, ids, weights, k_defer, flags, out)
            r = p.wait(timeout_ms)
            self.last_deferred = p.n_deferred
            return r
        if k_defer:
            raise ValueError(f"k_defer: {n} tokens are split into requests of "
                             f"{self.max_tokens}; deferral needs one request per layer")
        if out is None:
            if _is_torch(hidden):
                out = _torch().empty_like(hidden)
            else:
                import numpy as np

                out = np.empty_like(hidden)
        for s in range(0, n, self.max_tokens):
            e = min(n, s + self.max_tokens)
            self.forward_submit(layer, hidden[s:e], ids[s:e], weights[s:e], 0, flags,
                                out[s:e]).wait(timeout_ms)
        self.last_deferred = 0
        return out

    def prefetch(self, layer, ids=None, scores=None, timeout_ms=None):
        """Lookahead hint: expert ids with scores (higher = sooner), or scores alone = one
        router score per expert. Returns the loads started."""
        import array

        if scores is None:
            if ids is None:
                raise ValueError("prefetch: give ids, scores, or both")
            scores = [1.0] * len(ids)
        s = array.array("f", [float(x) for x in (scores.tolist() if hasattr(scores, "tolist")
                                                  else scores)])
        i = None
        if ids is not None:
            if hasattr(ids, "dtype") and not _is_integer(ids):
                raise ValueError(f"ids: dtype {ids.dtype} is not an integer type")
            i = array.array("i", [_int("ids", x) for x in (ids.tolist() if hasattr(ids, "tolist")
                                                           else ids)])
            if len(i) != len(s):
                raise ValueError(f"prefetch: {len(i)} ids but {len(s)} scores")
        t = self.timeout_ms if timeout_ms is None else timeout_ms
        self._recover()
        return self._ch.prefetch(layer, i, s, t)

    def set_gpu_mask(self, mask, layer=-1, timeout_ms=None):
        """The experts this client computes itself (the sidecar never loads them for it and a
        forward naming one fails with MaskedError). mask: truth values [n_layers][n_experts]
        for layer=-1, or [n_experts] for one block; or the packed bytes moe_set_gpu_mask takes
        (bit e%8 of byte e//8 per block row)."""
        E = self.n_experts
        row = (E + 7) // 8
        if isinstance(mask, (bytes, bytearray, memoryview)):
            packed = bytes(mask)
        else:
            rows = mask.tolist() if hasattr(mask, "tolist") else list(mask)
            if layer != -1:
                rows = [rows]
            packed = bytearray()
            for r, bits in enumerate(rows):
                bits = list(bits)
                if len(bits) != E:
                    raise ValueError(f"mask: row {r} has {len(bits)} entries, the model "
                                     f"{E} experts")
                b = bytearray(row)
                for e, on in enumerate(bits):
                    if on:
                        b[e // 8] |= 1 << (e % 8)
                packed += b
        t = self.timeout_ms if timeout_ms is None else timeout_ms
        self._recover()
        self._ch.set_gpu_mask(layer, bytes(packed), t)

    def stats(self, timeout_ms=None, experts=False):
        """The sidecar's STATS as a dict; experts=True adds "experts" (per MoE layer, every
        expert's routed-token count and heat; a 1.2 sidecar)."""
        t = self.timeout_ms if timeout_ms is None else timeout_ms
        flags = _native.STATS_EXPERTS if experts else 0
        self._recover()
        return json.loads(self._ch.stats_json(t, flags))

    def expert_stats(self, timeout_ms=None):
        """Per-(MoE layer, expert) routing the sidecar served since it started (every client's
        CPU-side FORWARDs): {"layers": the MoE layers' blocks, "counts": [layer][expert]
        tokens routed, "heat": [layer][expert] the same decayed, "half_life_tokens": its
        half-life}. Raises VersionError from a sidecar older than 1.2."""
        t = self.timeout_ms if timeout_ms is None else timeout_ms
        self._recover()
        counts_b, heat_b, half_life = self._ch.expert_stats(t)
        E = self.n_experts
        counts = memoryview(counts_b).cast("Q").tolist()
        heat = memoryview(heat_b).cast("f").tolist()
        return {"layers": self.moe_layers, "half_life_tokens": half_life,
                "counts": [counts[i:i + E] for i in range(0, len(counts), E)],
                "heat": [heat[i:i + E] for i in range(0, len(heat), E)]}

    def placement(self, gpu_experts, strategy="frequency", by="counts", apply=False,
                  timeout_ms=None):
        """Which experts to keep on the GPU, from this sidecar's per-expert load (by="counts":
        tokens routed since start, or "heat"): placement() over expert_stats(), with the
        model's blocks. apply=True also sets the result as this client's GPU mask. Returns
        placement()'s dict."""
        if by not in ("counts", "heat"):
            raise ValueError(f"placement: by={by!r}: counts or heat")
        st = self.expert_stats(timeout_ms)
        p = placement(st[by], gpu_experts, strategy, blocks=st["layers"],
                      n_blocks=self.info["n_layers"])
        if apply:
            self.set_gpu_mask(p["mask"], -1, timeout_ms)
        return p

    def ping(self, timeout_ms=None):
        t = self.timeout_ms if timeout_ms is None else timeout_ms
        self._recover()
        self._ch.ping(t)


    # ---- expert leases ---------------------------------------------------------------------
    def lease_pool(self, staging=False, pool=0):
        """The sidecar's slot pool (staging: this channel's staging area, serve
        --lease-staging-mib), mapped read-only (a sidecar started with --leases): an mmap
        object shared by every Lease of this channel generation. pool: which pool, on a
        sidecar that splits experts over NUMA nodes (one per node, 0 first)."""
        self._recover()
        key = "_staging" if staging else "_pool" if pool == 0 else f"_pool{int(pool)}"
        if getattr(self, key + "_gen", None) != self.generation:
            import mmap
            import os

            fd, size = self._ch.lease_pool(staging, pool)
            try:
                setattr(self, key, mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                             prot=mmap.PROT_READ))
            finally:
                os.close(fd)
            setattr(self, key + "_gen", self.generation)
        return getattr(self, key)

    def lease(self, layer, experts=None, dtype="raw", timeout_ms=None):
        """Leases experts of block `layer` (None: every expert of the layer) and returns a
        Lease (a context manager that releases them). dtype "raw": zero-copy views of the
        pool mapping in the served format; "bf16": the sidecar dequantizes each matrix to
        BF16 rows into this channel's staging area (serve --lease-staging-mib), and views()
        are zero-copy bfloat16 [rows, cols] tensors of it. Cold experts are loaded first
        (waited for up to timeout_ms)."""
        if dtype not in ("raw", "bf16"):
            raise ValueError(f"lease: dtype {dtype!r}: 'raw' or 'bf16'")
        layer = _int("layer", layer)
        t = self.timeout_ms if timeout_ms is None else timeout_ms
        if experts is None:
            ids, n = None, self.n_experts
        else:
            experts = [_int("expert", e) for e in experts]
            n = len(experts)
            if not 1 <= n <= 256:
                raise ValueError(f"lease: {n} experts (1..256)")
            ids = struct.pack(f"<{n}i", *experts)
        bf16 = dtype == "bf16"
        pool = self.lease_pool(staging=bf16)
        raw = self._ch.lease(layer, ids, n, t, _native.LEASE_BF16 if bf16 else 0)
        return Lease(self, layer, raw, pool, self.generation)

    # ---- CUDA ------------------------------------------------------------------------------
    def cuda_register(self):
        """Registers the channel's mapping with CUDA once (page-locked, device-visible), so
        stream copies go straight into and out of the slots. Returns the runtime wrapper."""
        from . import _cuda

        rt = _cuda.runtime()
        if self._cuda_registered is None:
            addr, size = self.region()
            rt.host_register(addr, size)
            self._cuda_registered = (rt, addr)
        self._cuda_wanted = True
        return rt

    # ---- restart ---------------------------------------------------------------------------
    def _recover(self):
        """Before a call's work: a channel an earlier call found dead (that call raised
        PeerDeadError) is reconnected first; if that fails, this call raises why."""
        if self._ch.dead and self.auto_reconnect and not self._ch.closed:
            self.reconnect()

    def reconnect(self, timeout_ms=None):
        """A new channel to the sidecar now serving this client's socket (moe_reconnect),
        waiting up to timeout_ms (default connect_timeout_ms; 0: not at all) for one that is
        starting. It must serve the model first connected to (RefusedError otherwise); the GPU
        mask set on this client is sent again. Requests in flight on the old channel are lost
        (their wait raises PeerDeadError), and so are experts a forward deferred into the next
        one (that next forward raises PeerDeadError). The mapping is new: BufferError while
        slot views of the old one live; a CUDA registration is moved to the new one (and
        KTMoEWrapper's stream path with it: captured CUDA graphs must be captured again).
        On failure the channel stays dead, and may be reconnected again."""
        t = self.connect_timeout_ms if timeout_ms is None else \
            _int("timeout_ms", timeout_ms, 0)
        sp = self._stream_path
        if sp is not None:
            sp.detach()  # its streams finish with the old mapping; its views go
        if self._ch.views:
            self._ch.reconnect(_native.CONNECT_NOWAIT)  # raises BufferError, changing nothing
        if self._cuda_registered is not None:
            rt, addr = self._cuda_registered
            self._cuda_registered = None
            rt.host_unregister(addr)
        self._ch.reconnect(t or _native.CONNECT_NOWAIT)
        self._refresh()
        if self._owed:
            self._lost_deferred, self._owed = True, False
        if self._cuda_wanted:
            self.cuda_register()
        if sp is not None:
            sp.attach()

    # ---- life ------------------------------------------------------------------------------
    def close(self):
        """Disconnects. Raises BufferError while slot views are alive."""
        if self._ch.closed:
            return
        if self._ch.views:
            self._ch.close()  # raises BufferError, before CUDA lets go of the mapping
        if self._cuda_registered is not None:
            rt, addr = self._cuda_registered
            rt.host_unregister(addr)
            self._cuda_registered = None
        self._cuda_wanted = False
        self._ch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        i = self.info
        return (f"<moe_sidecar.Client {i['model_name']} {i['fingerprint'][:12]} "
                f"layers={i['n_moe_layers']} experts={i['n_experts']} hidden={i['hidden']} "
                f"pid={i['sidecar_pid']}{' closed' if self.closed else ''}>")


__all__ = ["Client", "Pending", "SlotView", "fingerprint", "placement", "PLACEMENT_STRATEGIES",
           "DTYPE_F32", "DTYPE_F16",
           "DTYPE_BF16", "FWD_DROP_DEFERRED", "FWD_DEFER_COLD",
           "FWD_DEFER_UNION"]
