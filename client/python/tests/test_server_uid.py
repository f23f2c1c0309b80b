"""Client(server_uid=...): whose server a client talks to. libmoe_client reads the listening
server's uid (SO_PEERCRED) before it sends anything; root's, the client's own or server_uid's
is accepted, any other is refused."""

import os
import shutil
import tempfile

import pytest

import moe_sidecar as ms

from conftest import Sidecar, generate

NOBODY = 65534


def test_server_uid_is_range_checked(served_bf16):
    for bad in (-1, 2**32, 2**40):
        with pytest.raises(OverflowError,
                           match=rf"server_uid: {bad} is out of range \(0\.\.4294967295\)"):
            ms.Client(served_bf16.socket, server_uid=bad)
    with pytest.raises(TypeError, match="server_uid: '0' is not an integer"):
        ms.Client(served_bf16.socket, server_uid="0")
    with ms.Client(served_bf16.socket, server_uid=2**32 - 1) as c:  # root's server: ours
        assert c.server_uid == 2**32 - 1
        c.ping()


@pytest.fixture(scope="module")
def served_by_nobody():
    if os.geteuid() != 0:
        pytest.skip("starting a sidecar as another user needs root")
    d = tempfile.mkdtemp(prefix="moe-py-uid-")
    os.chmod(d, 0o755)  # the model, readable by the sidecar's uid
    model = generate(os.path.join(d, "m.gguf"), fmt="q8_0")
    s = Sidecar(model, "--allow-uid", str(os.geteuid()), user=NOBODY)  # it takes us too
    yield s
    assert s.stop() == 0
    shutil.rmtree(d)


def test_a_server_of_another_uid_is_refused_unless_named(served_by_nobody):
    sock = served_by_nobody.socket
    with pytest.raises(ms.RefusedError, match=rf"runs as uid {NOBODY} .*not as root, this "
                                              rf"client's uid {os.geteuid()};"):
        ms.Client(sock)
    with pytest.raises(ms.RefusedError, match=rf"or uid {NOBODY + 1} \(server_uid\)"):
        ms.Client(sock, server_uid=NOBODY + 1)
    with ms.Client(sock, server_uid=NOBODY) as c:
        c.ping()
        info = c.info
    dims = (info["moe_layers"][0], info["n_experts"], info["model_top_k"],
            info["model_hidden"], info["expert_ffn"])
    with pytest.raises(ms.RefusedError, match=f"runs as uid {NOBODY}"):
        ms.KTMoEWrapper(*dims, socket=sock)
    wr = ms.KTMoEWrapper(*dims, socket=sock, server_uid=NOBODY)
    assert wr.client.server_uid == NOBODY
