"""Arguments the binding refuses before anything reaches the wire: every integer is
range-checked against the C field it fills (never wrapped into it), and the refusal names the
argument, the value and the range."""

import os

import numpy as np
import pytest

import moe_sidecar as ms

torch = pytest.importorskip("torch")

BIG = 2**40  # wraps to 0 in a uint32 or int32 field


@pytest.fixture(scope="module")
def client(served_bf16):
    c = ms.Client(served_bf16.socket)
    yield c
    c.close()


def _batch(c, n=1, k=2):
    x = np.zeros((n, c.hidden), np.float32)
    w = np.full((n, k), 1.0 / k, np.float32)
    return x, w


@pytest.mark.parametrize("ids, shown", [
    (np.array([[BIG, 1]], np.int64), str(BIG)),              # was expert 0
    (np.array([[2**64 - 1, 1]], np.uint64), str(2**64 - 1)),  # was -1: skipped
    (np.array([[1, -2**31 - 1]], np.int64), str(-2**31 - 1)),
])
def test_ids_outside_int32_are_refused_not_wrapped(client, ids, shown):
    x, w = _batch(client)
    with pytest.raises(ValueError, match=rf"ids: token 0: {shown} is not an expert id "
                                         rf"\(0\.\.{client.n_experts - 1}, -1 = skip\)"):
        client.forward(1, x, ids, w)
    if ids.dtype == np.int64:
        with pytest.raises(ValueError, match=rf"ids: token 0: {shown} is not an expert id"):
            client.forward(1, torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(w))
    # Nothing was left behind: the channel still computes.
    client.forward(1, x, np.array([[0, 1]]), w)


def test_float_ids_are_refused(client):
    x, w = _batch(client)
    with pytest.raises(ValueError, match="ids: dtype float32 is not an integer type"):
        client.forward(1, x, np.array([[0, 1]], np.float32), w)
    with pytest.raises(TypeError, match="ids: 0.5 is not an integer"):
        client.prefetch(1, ids=[0.5], scores=[1.0])


U32 = r"0\.\.4294967295"
I32 = r"-2147483648\.\.2147483647"


@pytest.mark.parametrize("call, match", [
    (lambda c: c._ch.release(BIG), rf"slot: {BIG} is out of range \({U32}\)"),
    (lambda c: c._ch.wait(BIG, 0, True), rf"slot: {BIG} is out of range \({U32}\)"),
    (lambda c: c._ch.slot_layout(-1), rf"index: -1 is out of range \({U32}\)"),
    (lambda c: c._ch.area(0, BIG * BIG * BIG * BIG), r"length: \d+ is out of range"),
    (lambda c: c.forward(1, *_ids_and(c), flags=BIG), rf"flags: {BIG} is out of range "
                                                      r"\(0\.\.65535\)"),
    (lambda c: c.forward(1, *_ids_and(c), timeout_ms=BIG), rf"timeout_ms: {BIG} is out of "
                                                           rf"range \({I32}\)"),
    (lambda c: c.ping(timeout_ms=BIG), rf"timeout_ms: {BIG} is out of range \({I32}\)"),
    (lambda c: c.stats(timeout_ms=-BIG), rf"timeout_ms: -{BIG} is out of range"),
    (lambda c: c.prefetch(BIG, ids=[0], scores=[1.0]), rf"layer: {BIG} is out of range "
                                                       rf"\({I32}\)"),
    (lambda c: c.prefetch(1, ids=[BIG], scores=[1.0]), rf"ids: {BIG} is out of range "
                                                       rf"\({I32}\)"),
    (lambda c: c.set_gpu_mask(b"\0\0", layer=BIG), rf"layer: {BIG} is out of range"),
    (lambda c: c.placement(BIG), rf"gpu_experts: {BIG} is out of range \({U32}\)"),
    (lambda c: ms.placement([[1.0, 2.0]], 1, blocks=[BIG]), rf"blocks: {BIG} is out of "
                                                            rf"range \({I32}\)"),
    (lambda c: ms.placement([[1.0, 2.0]], -1), rf"gpu_experts: -1 is out of range \({U32}\)"),
])
def test_integers_out_of_their_field_are_refused_by_name(client, call, match):
    with pytest.raises(OverflowError, match=match):
        call(client)
    client.ping()  # and the channel is still fine


def _ids_and(c):
    x, w = _batch(c)
    return x, np.array([[0, 1]]), w


@pytest.mark.parametrize("kw, match", [
    ({"max_tokens": BIG}, rf"max_tokens: {BIG} is out of range \({U32}\)"),  # was: default
    ({"top_k": -1}, rf"top_k: -1 is out of range \({U32}\)"),
    ({"n_slots": BIG}, rf"n_slots: {BIG} is out of range"),
    ({"timeout_ms": BIG}, rf"timeout_ms: {BIG} is out of range \({I32}\)"),
    ({"connect_timeout_ms": BIG}, rf"connect_timeout_ms: {BIG} is out of range"),
])
def test_client_limits_out_of_range_are_refused(served_bf16, kw, match):
    with pytest.raises(OverflowError, match=match):
        ms.Client(served_bf16.socket, **kw)


def test_integers_of_other_types(client):
    """Anything with __index__ is an integer (numpy's, a 0-d torch integer tensor); a float
    is not, even a whole one."""
    x, ids, w = _ids_and(client)
    client.forward(np.int64(1), x, ids, w, k_defer=np.int32(0), timeout_ms=np.int64(30000))
    client.ping(torch.tensor(30000))
    with pytest.raises(TypeError, match="timeout_ms: 1.0 is not an integer"):
        client.ping(1.0)
    with pytest.raises(TypeError, match="layer: 1.0 is not an integer"):
        client.forward(1.0, x, ids, w)
    with pytest.raises(TypeError, match="k_defer: 0.0 is not an integer"):
        client.forward(1, x, ids, w, k_defer=0.0)
    with pytest.raises(TypeError, match="index: 0.0 is not an integer"):
        client.slot(0.0)


# ---- the kt-kernel wrapper -------------------------------------------------------------------

@pytest.fixture(scope="module")
def dims(client):
    """kt's five dimensions of block 1 of the served model."""
    i = client.info
    return 1, i["n_experts"], i["model_top_k"], i["model_hidden"], i["expert_ffn"]


def _wrapper_batch(dims):
    x = torch.zeros(1, dims[3], dtype=torch.bfloat16)
    return x, torch.full((1, 2), 0.5)


@pytest.mark.parametrize("masked", [False, True])
def test_wrapper_refuses_an_id_past_the_experts_alike_with_a_gpu_mask(served_bf16, dims,
                                                                       masked):
    E = dims[1]
    kw = {"gpu_experts_mask": torch.arange(E) < 4} if masked else {}
    wr = ms.KTMoEWrapper(*dims, socket=served_bf16.socket, **kw)
    x, w = _wrapper_batch(dims)
    with pytest.raises(ms.BadExpertError) as ei:  # was: IndexError with the mask
        wr.forward(x, torch.tensor([[5, E]]), w)
    assert ei.value.value == E
    with pytest.raises(ms.BadExpertError) as ei:
        wr.forward(x, torch.tensor([[-5, 5]]), w)
    assert ei.value.value == -5
    assert wr.forward(x, torch.tensor([[5, 1]]), w).shape == x.shape  # and it goes on


def test_wrapper_refuses_ids_it_cannot_send(served_bf16, dims):
    wr = ms.KTMoEWrapper(*dims, socket=served_bf16.socket, gpu_experts_mask=[True] + [False] *
                         (dims[1] - 1))
    x, w = _wrapper_batch(dims)
    with pytest.raises(ValueError, match="topk_ids: dtype torch.float32 is not an integer"):
        wr.forward(x, torch.tensor([[5.0, 1.0]]), w)
    with pytest.raises(ValueError, match=rf"ids: token 0: {2**40} is not an expert id"):
        wr.forward(x, torch.tensor([[2**40, 1]]), w)  # was: expert 0, on the GPU: skipped
    with pytest.raises(ValueError, match=rf"ids: token 0: {2**32 + 5} is not an expert id"):
        wr.forward(x, torch.tensor([[2**32 + 5, 1]]), w)  # was: expert 5


def test_wrapper_takes_kt_arguments_by_keyword_only(served_bf16, dims):
    """kt-kernel's order after the five dimensions differs from ours (a positional call put
    weight_path into threadpool_count): only keywords are taken there."""
    with pytest.raises(TypeError, match="positional"):
        ms.KTMoEWrapper(*dims, None, 2, 1, 1, "/models/x", socket=served_bf16.socket)
    with pytest.raises(TypeError, match="layer_idx: 1.0 is not an integer"):
        ms.KTMoEWrapper(1.0, *dims[1:], socket=served_bf16.socket)
    with pytest.raises(ValueError, match="max_deferred_experts_per_token=-1 not in 0..8"):
        ms.KTMoEWrapper(*dims, max_deferred_experts_per_token=-1, socket=served_bf16.socket)


def test_wrapper_refuses_a_gpu_mask_with_a_count(served_bf16, dims):
    with pytest.raises(ValueError, match="gpu_experts_mask or num_gpu_experts, not both"):
        ms.KTMoEWrapper(*dims, gpu_experts_mask=[False] * dims[1], num_gpu_experts=4,
                        socket=served_bf16.socket)


def test_wrapper_errors_name_the_socket_used(served_bf16, dims, monkeypatch):
    monkeypatch.setenv("MOE_SIDECAR_SOCKET", served_bf16.socket)
    try:
        with pytest.raises(ValueError, match=rf"hidden_size=1, but the sidecar at "
                                             rf"{served_bf16.socket} serves"):
            ms.KTMoEWrapper(*dims[:3], 1, dims[4])
    finally:
        c = ms.kt._SHARED.pop((None, os.getpid()), None)
        if c is not None:
            c.close()
    with ms.Client() as c:
        assert c.socket is None and c.socket_path == served_bf16.socket
