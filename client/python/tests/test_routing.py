"""Routing through the binding: per-expert counts and heat (expert_stats, stats(experts=True)),
GPU expert placement (moe_sidecar.placement, Client.placement with apply=True)."""

import math

import pytest

import moe_sidecar as ms

from conftest import Sidecar, generate


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("routing")
    s = Sidecar(generate(str(d / "q8.gguf"), fmt="q8_0"), "--heat-half-life", "8")
    yield s
    assert s.stop() == 0


def _forward(c, layer, ids):
    """One FORWARD of len(ids) tokens naming ids[t] (lists of expert ids) at block layer."""
    k = max(len(r) for r in ids)
    rows = [r + [-1] * (k - len(r)) for r in ids]
    hidden = [[0.01 * ((t + j) % 7) for j in range(c.hidden)] for t in range(len(ids))]
    weights = [[0.5] * k for _ in ids]
    import numpy as np

    c.forward(layer, np.array(hidden, dtype=np.float32), np.array(rows, dtype=np.int32),
              np.array(weights, dtype=np.float32))


def test_version_matches_the_protocol():
    assert ms.ABI == (1, 4)
    assert ms.__version__ == "1.4.0"


def test_expert_stats_count_what_was_routed(served):
    with ms.Client(served.socket, max_tokens=8) as c:
        before = c.expert_stats()
        layer = c.moe_layers[1]
        _forward(c, layer, [[3, 5], [3, 9], [3]])
        st = c.expert_stats()
        assert st["half_life_tokens"] == 8
        assert st["layers"] == c.moe_layers
        row, row0 = st["counts"][1], before["counts"][1]
        assert [row[e] - row0[e] for e in (3, 5, 9, 4)] == [3, 1, 1, 0]
        assert len(st["counts"]) == len(c.moe_layers) and len(row) == c.n_experts
        assert st["heat"][1][3] >= 3 * math.pow(2, -3 / 8) - 1e-4
        doc = c.stats(experts=True)
        assert doc["heat_half_life_tokens"] == 8
        assert [x["layer"] for x in doc["experts"]] == c.moe_layers
        assert doc["experts"][1]["counts"] == row
        assert "experts" not in c.stats()


def test_placement_by_hand():
    p = ms.placement([[10, 0, 5, 1], [2, 8, 1, 0]], 3, "frequency", blocks=[1, 3], n_blocks=4)
    assert p["mask"] == bytes([0, 0x5, 0, 0x2])
    assert p["covered"] == pytest.approx(23 / 27)
    assert p["gpu_experts_mask"][1] == [True, False, True, False]
    assert p["gpu_experts_mask"][0] == [False] * 4
    assert set(p["coverage"]) == set(ms.PLACEMENT_STRATEGIES)
    assert max(p["coverage"].values()) == p["coverage"]["frequency"]
    assert ms.placement([[10, 0, 5, 1], [2, 8, 1, 0]], 5,
                        "front-loading")["mask"] == bytes([0xf, 0x2])
    with pytest.raises(ValueError):
        ms.placement([[1, 2]], 1, "hottest")
    with pytest.raises(ValueError):
        ms.placement([[1, -2]], 1)


def test_client_placement_applies_the_mask(served):
    with ms.Client(served.socket, max_tokens=8) as c:
        layer = c.moe_layers[0]
        for _ in range(3):
            _forward(c, layer, [[7, 2], [7]])
        p = c.placement(1, apply=True)
        assert p["gpu_experts_mask"][layer][7]
        assert sum(sum(r) for r in p["gpu_experts_mask"]) == 1
        with pytest.raises(ms.MaskedError):
            _forward(c, layer, [[7]])
        _forward(c, layer, [[2]])  # the others stay on the CPU side
        assert c.stats()["gpu_mask_switches"] >= 1
        with pytest.raises(ValueError):
            c.placement(1, by="weights")
