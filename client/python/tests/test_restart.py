"""A sidecar killed (-9) and restarted on the same socket, under a running Client and under
running KTMoEWrapper layers (the CPU path; test_cuda.py has the stream path's).

What they pin: a request in flight at the death fails with PeerDeadError exactly once, and so
does a forward owed experts that were deferred before it; the next call reconnects and gives
the bits it gave before the kill (the sidecar is deterministic), with the GPU mask in force
again; a restart on another model is refused until the right one is back; a sidecar not back
yet is ConnectError, and the call after tries again; a KTMoEWrapper made after a restart works;
reconnecting moves a CUDA registration from the old mapping to the new one.

Every wait is on a process (READY on --ready-fd, waitpid): no sleeps, no timing thresholds.
"""

import os
import signal

import numpy as np
import pytest

import moe_sidecar as ms

from conftest import Sidecar


def _kill(sidecar):
    os.kill(sidecar.proc.pid, signal.SIGKILL)
    sidecar.proc.wait(30)


def _stopped_then_killed(sidecar, submit):
    """submit() while the sidecar is stopped (it completes nothing), then kill it: what
    submit() returned was in flight at the death, whatever the scheduling."""
    os.kill(sidecar.proc.pid, signal.SIGSTOP)
    os.waitpid(sidecar.proc.pid, os.WUNTRACED)
    try:
        return submit()
    finally:
        _kill(sidecar)


def _inputs(c, seed, n=3):
    """Per MoE layer: activations, ids (never expert 0: the GPU's below) and weights."""
    rng = np.random.default_rng(seed)
    k = c.info["model_top_k"]
    out = []
    for _ in c.moe_layers:
        x = rng.standard_normal((n, c.hidden)).astype(np.float32)
        ids = np.stack([1 + rng.choice(c.n_experts - 1, size=k, replace=False)
                        for _ in range(n)])
        w = rng.uniform(0.05, 1.0, size=(n, k)).astype(np.float32)
        out.append((x, ids, w))
    return out


def _step(c, inputs):
    """Every MoE layer once, each deferring one expert per token into the next."""
    layers = c.moe_layers
    return [c.forward(l, x, ids, w, k_defer=0 if i == len(layers) - 1 else 1)
            for i, (l, (x, ids, w)) in enumerate(zip(layers, inputs))]


def _assert_same(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.tobytes() == y.tobytes(), f"layer {i}: not the same bits"


def _masked_forward(c):
    """A forward naming expert 0 of the first MoE layer, the GPU's: MaskedError."""
    x = np.zeros((1, c.hidden), np.float32)
    return c.forward(c.moe_layers[0], x, np.array([[0, 1]]), np.array([[0.5, 0.5]], np.float32))


def test_a_client_resumes_after_kill9_and_restart_with_the_same_bits(tmp_path, models):
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["q8_0"], socket=sock)
    second = None
    try:
        c = ms.Client(sock, timeout_ms=20000)
        c.set_gpu_mask([e == 0 for e in range(c.n_experts)], layer=c.moe_layers[0])
        inputs = _inputs(c, 1)
        before = _step(c, inputs)
        with pytest.raises(ms.MaskedError):
            _masked_forward(c)
        x, ids, w = inputs[0]
        layer = c.moe_layers[0]
        # Two requests in flight when the sidecar dies; a restart before either is waited.
        p1, p2 = _stopped_then_killed(first, lambda: (c.forward_submit(layer, x, ids, w),
                                                      c.forward_submit(layer, x, ids, w)))
        second = Sidecar(models["q8_0"], socket=sock)
        with pytest.raises(ms.PeerDeadError):
            p1.wait()
        assert c.generation == 1, "the failing call does not reconnect"
        after = _step(c, inputs)  # the next call reconnects first
        assert c.generation == 2
        _assert_same(before, after)
        # p2 was sent to the dead sidecar: it fails once, without touching the new channel's
        # slot of the same index.
        with pytest.raises(ms.PeerDeadError, match="reconnected since"):
            p2.wait()
        _assert_same(before, _step(c, inputs))
        with pytest.raises(ms.MaskedError):
            _masked_forward(c)  # the C library sent the mask again
        assert c.info["sidecar_pid"] == second.proc.pid
        c.close()
    finally:
        first.stop(signal.SIGKILL)
        if second:
            assert second.stop() == 0


def test_a_forward_owed_deferred_experts_fails_once_after_a_restart(tmp_path, models):
    """A layer deferred experts into the next forward, then the sidecar died and another call
    (a ping here; a prefetch, a new wrapper) found it: the reconnect loses what was owed, so
    the next forward fails rather than return a layer without it; the one after works."""
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["q8_0"], socket=sock)
    second = None
    try:
        c = ms.Client(sock, timeout_ms=20000)
        (x0, ids0, w0), (x1, ids1, w1) = _inputs(c, 2)[:2]
        l0, l1 = c.moe_layers[:2]
        alone = c.forward(l1, x1, ids1, w1)  # nothing owed to it
        c.forward(l0, x0, ids0, w0, k_defer=1)
        assert c.last_deferred > 0
        _kill(first)
        second = Sidecar(models["q8_0"], socket=sock)
        with pytest.raises(ms.PeerDeadError):
            c.ping()
        with pytest.raises(ms.PeerDeadError, match="deferred"):
            c.forward(l1, x1, ids1, w1)
        assert c.generation == 2
        assert c.forward(l1, x1, ids1, w1).tobytes() == alone.tobytes()
        c.close()
    finally:
        first.stop(signal.SIGKILL)
        if second:
            assert second.stop() == 0


def test_a_sidecar_not_back_is_connect_error_and_the_next_call_tries_again(tmp_path, models):
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["q8_0"], socket=sock)
    second = None
    try:
        c = ms.Client(sock, connect_timeout_ms=0)  # reconnecting waits for nothing
        _kill(first)
        with pytest.raises(ms.PeerDeadError):
            c.ping()
        for _ in range(2):
            with pytest.raises(ms.ConnectError, match="is moe-sidecar serve running"):
                c.ping()
        view = c.slot(0).input()
        second = Sidecar(models["q8_0"], socket=sock)
        with pytest.raises(BufferError, match="slot views"):
            c.ping()  # the old mapping is still viewed: reconnecting would unmap it
        assert c.generation == 1
        del view
        c.ping()
        assert c.generation == 2
        c.close()
    finally:
        first.stop(signal.SIGKILL)
        if second:
            assert second.stop() == 0


def test_a_restart_on_another_model_is_refused_until_the_right_one_is_back(tmp_path, models):
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["bf16"], socket=sock)
    other = second = None
    try:
        c = ms.Client(sock, timeout_ms=20000)
        inputs = _inputs(c, 3)
        before = _step(c, inputs)
        _kill(first)
        other = Sidecar(models["other"], socket=sock)
        with pytest.raises(ms.PeerDeadError):
            _step(c, inputs)
        for _ in range(2):  # each call tries again, and is refused again
            with pytest.raises(ms.RefusedError, match="expects"):
                _step(c, inputs)
        _kill(other)
        second = Sidecar(models["bf16"], socket=sock)
        _assert_same(before, _step(c, inputs))
        assert c.fingerprint == ms.fingerprint(models["bf16"])
        c.close()
    finally:
        first.stop(signal.SIGKILL)
        if other:
            other.stop(signal.SIGKILL)
        if second:
            assert second.stop() == 0


# ---- KTMoEWrapper (CPU path) -----------------------------------------------------------------

def _wrappers(sock, info, **kw):
    return [ms.KTMoEWrapper(l, info["n_experts"], info["model_top_k"], info["model_hidden"],
                            info["expert_ffn"], socket=sock, num_gpu_experts=2,
                            max_deferred_experts_per_token=1, **kw)
            for l in info["moe_layers"]]


def _wrapper_inputs(torch, info, seed, n=2):
    g = torch.Generator().manual_seed(seed)
    E, k = info["n_experts"], info["model_top_k"]
    out = []
    for _ in info["moe_layers"]:
        x = torch.randn(n, info["hidden"], generator=g).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(n)])
        w = torch.rand(n, k, generator=g) + 0.05
        out.append((x, ids, w / w.sum(1, keepdim=True)))
    return out


def _wrapper_step(wrappers, inputs):
    return [wr.forward(x, ids, w) for wr, (x, ids, w) in zip(wrappers, inputs)]


def _assert_same_tensors(a, b):
    import torch

    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype == torch.bfloat16
        assert torch.equal(x.view(torch.int16), y.view(torch.int16)), f"layer {i}: other bits"


def test_a_kt_wrapper_loop_resumes_after_kill9_and_restart(tmp_path, models):
    torch = pytest.importorskip("torch")
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["bf16"], socket=sock)
    second = third = None
    try:
        c = ms.Client(sock)
        info = c.info
        c.close()
        wrappers = _wrappers(sock, info)
        inputs = _wrapper_inputs(torch, info, 5)
        before = _wrapper_step(wrappers, inputs)
        assert all(o.abs().sum() > 0 for o in before)
        # Mid-step: the first layers done (each deferring into the next), the third in
        # flight when the sidecar dies.
        for wr, (x, ids, w) in zip(wrappers[:2], inputs[:2]):
            wr.forward(x, ids, w)
        x, ids, w = inputs[2]
        _stopped_then_killed(first, lambda: wrappers[2].submit_forward(x, ids, w))
        second = Sidecar(models["bf16"], socket=sock)
        with pytest.raises(ms.PeerDeadError):
            wrappers[2].sync_forward(x)
        # The engine fails that step and runs it again: the same bits, the layers' GPU masks
        # in force again (sent by the C library: the wrappers' ids of experts 0 and 1 are -1
        # anyway, so the bits do not show it).
        _assert_same_tensors(before, _wrapper_step(wrappers, inputs))
        shared = wrappers[0].client  # the channel every wrapper shares
        assert shared.generation == 2
        with pytest.raises(ms.MaskedError):
            shared.forward(info["moe_layers"][0], np.zeros((1, info["hidden"]), np.float32),
                           np.array([[0, 5]]), np.array([[0.5, 0.5]], np.float32))
        # Killed and restarted between steps, with no call in between: a wrapper made now
        # gets the channel reconnected, not the dead one, and the old wrappers carry on.
        _kill(second)
        third = Sidecar(models["bf16"], socket=sock)
        last = info["moe_layers"][-1]
        fresh = ms.KTMoEWrapper(last, info["n_experts"], info["model_top_k"],
                                info["model_hidden"], info["expert_ffn"], socket=sock,
                                num_gpu_experts=2)
        assert shared.generation == 3
        x, ids, w = inputs[-1]
        alone = fresh.forward(x, ids, w)
        assert alone.abs().sum() > 0
        _assert_same_tensors([alone], [wrappers[-1].forward(x, ids, w)])
        _assert_same_tensors(before, _wrapper_step(wrappers, inputs))
    finally:
        first.stop(signal.SIGKILL)
        for s in (second, third):
            if s:
                s.stop(signal.SIGKILL)


# ---- the CUDA registration, with a stand-in runtime ------------------------------------------

class _FakeRuntime:
    def __init__(self):
        self.calls = []

    def host_register(self, addr, size):
        self.calls.append(("register", addr, size))

    def host_unregister(self, addr):
        self.calls.append(("unregister", addr))


class _FakeStreamPath:
    """Holds a view of the mapping, as kt's stream path does."""

    def __init__(self, client, calls):
        self.client, self.calls = client, calls
        self.attach()

    def detach(self):
        self.calls.append(("detach",))
        self.view = None

    def attach(self):
        self.view = self.client.slot(0).input()
        self.calls.append(("attach", self.client.region()[0]))


def test_reconnect_moves_the_cuda_registration_to_the_new_mapping(tmp_path, models,
                                                                  monkeypatch):
    """The order a GPU needs, checked without one: the stream path lets go of its views, the
    old mapping is unregistered, the channel reconnected, the new mapping registered, and the
    stream path takes a slot of it."""
    from moe_sidecar import _cuda

    rt = _FakeRuntime()
    monkeypatch.setattr(_cuda, "runtime", lambda: rt)
    sock = str(tmp_path / "run" / "s.sock")
    first = Sidecar(models["q8_0"], socket=sock)
    second = None
    try:
        c = ms.Client(sock)
        c.cuda_register()
        old, size = c.region()
        c._stream_path = _FakeStreamPath(c, rt.calls)
        _kill(first)
        second = Sidecar(models["q8_0"], socket=sock)
        c.reconnect()
        new, new_size = c.region()
        assert rt.calls == [("register", old, size), ("attach", old), ("detach",),
                            ("unregister", old), ("register", new, new_size), ("attach", new)]
        c._stream_path = None
        c.ping()
        c.close()
        assert rt.calls[-1] == ("unregister", new)
    finally:
        first.stop(signal.SIGKILL)
        if second:
            assert second.stop() == 0
