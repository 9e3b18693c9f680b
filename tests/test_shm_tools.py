"""The shared-memory wire in the tools: auto's choice, the cost model, dt model, dt tune, dt bench.

Performance is measured by the benchmarks (dt bench collectives --transport
both, dt bench idle), never asserted here: these check that the tools price,
choose and report both wires, and that dt tune refuses noisy curves.
"""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from dt import cost, transport
from dt.collectives import auto
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)


def test_auto_prices_both_wires():
    shm, sockets = cost.DEFAULT_SHM_MACHINE, cost.DEFAULT_MACHINE
    for p in (2, 4, 8):
        assert auto.best("all_reduce", 4 << 10, p, shm, True, 32 << 20) == "one_shot"
        assert auto.best("all_reduce", 32 << 20, p, shm, True, 32 << 20) == "two_shot"
        for n in (4 << 10, 32 << 20):  # never a load/store algorithm without shared memory
            assert not auto.best("all_reduce", n, p, sockets, False).endswith("_shot")
    assert "one_shot" not in auto.candidates("all_reduce", False)
    assert {"one_shot", "two_shot"} <= set(auto.candidates("all_reduce", True))


def test_load_store_formulas():
    n, p = 1 << 20, 4
    assert cost.formula("all_reduce", "one_shot", n, p) == (1, p * n, (p - 1) * n)  # n in, (p-1) n read
    steps, moved, reduced = cost.formula("all_reduce", "two_shot", n, p)  # n in, 2(p-1)/p n read
    assert steps == 2 and moved == pytest.approx((3 * p - 2) / p * n) and reduced == 3 * n / 4
    assert cost.formula("all_reduce", "two_shot", 64 << 20, p, stage_bytes=32 << 20)[0] == 4
    # traffic: two-shot reads 2(p-1)/p n from peers, the ring's bytes in 2 syncs, not 2(p-1) steps
    t = cost.traffic_for("all_reduce", "two_shot", n, 1, p, 0)
    assert t.bytes_received == t.bytes_sent == 2 * (p - 1) * n // p and t.steps == 2
    assert cost.traffic_for("all_reduce", "one_shot", n, 1, p, 0).bytes_received == (p - 1) * n


def _choices() -> list[str]:
    g = transport.resolve_group(None)
    transport.connect(g)
    return [auto.choose("all_reduce", "auto", n, g) for n in (4 << 10, 64 << 20)] + \
        [auto.choose("all_reduce", "auto", n, dist.get_world_size()) for n in (4 << 10, 64 << 20)]


def test_auto_on_a_shared_group_picks_load_store_and_agrees(run):
    picks = run(2, _choices)
    assert picks[0] == picks[1]
    on_group, by_size = picks[0][:2], picks[0][2:]
    assert all(a.endswith("_shot") for a in on_group)
    assert not any(a.endswith("_shot") for a in by_size)  # a bare size means the torch wire


def test_dt_model_adds_load_store_rows_for_a_shared_memory_wire(capsys):
    from dt.tools import whatif

    assert whatif.main(["all_reduce", "--size", "4KB,32MB", "--world", "4", "--latency", "200us",
                        "--bandwidth", "1.2GB/s", "--sync", "15us", "--memcpy", "5GB/s",
                        "--reduce", "2GB/s"]) == 0
    out = capsys.readouterr().out
    assert "one_shot *" in out and "two_shot *" in out and "sync 15 us" in out


def test_tune_rejects_curves_that_shrink_with_size():
    from dt.tools.tune import unsteady

    assert unsteady({4: 1e-4, 1 << 18: 3e-4, 1 << 20: 9e-4}) is None
    why = unsteady({4: 4.2e-3, 1 << 18: 3e-4, 1 << 20: 5.8e-4})  # the loaded machine's alpha
    assert why is not None and "262,144 B" in why
    assert unsteady({1 << 20: 1e-3, 4 << 20: 0.9e-3}) is None  # within 25%: noise, kept


@pytest.mark.timeout(200)
def test_bench_collectives_both_wires_shared_buffers_and_bound(tmp_path):
    import dt.bench.collectives as bc

    out = tmp_path / "r.json"
    assert bc.main(["-b", "4KB", "-e", "16KB", "-f", "4", "-n", "2", "-w", "1", "--world", "2",
                    "--algorithms", "ring,one_shot,two_shot,auto", "--transport", "both", "--shared",
                    "--quiet", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    names = {r["algorithm"] for r in data["results"]}
    assert {"ring@shm", "ring@torch", "one_shot@shm", "two_shot@shm", "auto@shm", "auto@torch",
            "torch"} <= names
    assert not {"one_shot@torch", "two_shot@torch"} & names  # load/store only on shared memory
    assert all(r["wrong"] == 0 and r["memcpy_gbps"] > 0 for r in data["results"])
    assert data["machine"]["shared"] and data["machine"]["transports"] == ["shm", "torch"]
