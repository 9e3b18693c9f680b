"""dt's written-out Adam: torch.optim.Adam's update, and the working set the planner prices."""

from __future__ import annotations

import pytest
import torch

from dt.cost.stack import STACKS
from dt.device_memory import LiveBytes
from dt.train.optim import Adam

pytestmark = [pytest.mark.timeout(60), pytest.mark.quick]


@pytest.mark.parametrize("shapes", [[(7, 3), (5,)], [(1,)], [(0,)], [(64, 65), (1, 1), (13,)]])
def test_steps_as_torch_adam_does(shapes: list[tuple[int, ...]]) -> None:
    torch.manual_seed(0)
    mine = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in mine]
    ours, torchs = Adam(mine, lr=3e-2, eps=1e-6), torch.optim.Adam(theirs, lr=3e-2, eps=1e-6, foreach=False)
    for _ in range(6):
        grads = [torch.randn(s, dtype=torch.float64) for s in shapes]
        for p, q, g in zip(mine, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        torchs.step()
    for p, q in zip(mine, theirs):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ours.state[p]["exp_avg_sq"], torchs.state[q]["exp_avg_sq"])


def test_a_step_holds_its_working_copies_of_one_parameter_at_a_time() -> None:
    big, small = torch.nn.Parameter(torch.randn(1000)), torch.nn.Parameter(torch.randn(10, 10))
    opt = Adam([big, small])
    for p in (big, small):
        p.grad = torch.randn_like(p)
    opt.step()  # the first step makes the moments: state, not the working set
    with LiveBytes() as live:
        opt.step()
    assert live.peak == STACKS["dt"].optimizer_copies * big.numel() * big.element_size()
    assert live.current == 0
