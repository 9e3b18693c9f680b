"""ZeRO over several groups at once: one ZeroOptimizer per part of the parameters, stepped as one.

With experts, the dense parameters are replicated over the whole dp x cp
plane but each expert only over its replicas (grid.group("edp"), the plane's
ranks holding the same experts). So the dense part is sharded over the plane
and each expert part over its edp group, its gradient summed there and
divided by the plane's size (every plane rank's tokens reached it: the same
average DDP-less training takes, dt.parallel.expert.style). Per rank, with
K bytes of optimizer state per parameter (zero_memory_formula, per part):

    stage 1   4 (Psi_d + Psi_e) + 4 (Psi_d + Psi_e) + K (Psi_d / N + Psi_e / R)
    stage 2   4 (Psi_d + Psi_e) + (4 + K) (Psi_d / N + Psi_e / R)

N = dp * cp, R = N / ep the expert's replicas, Psi_e this rank's experts.
The state is sharded over R, not kept whole per replica group: the same
ZeroOptimizer on a smaller group costs nothing more to write, and keeps the
formula one rule (each part divides by the ranks that hold it).

    opt = ZeroParts([ZeroOptimizer(dense, Adam, group=plane),
                     ZeroOptimizer(experts, Adam, group=edp, divisor=plane_size)])
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from dt.parallel.zero.optimizer import ZeroOptimizer

__all__ = ["ZeroParts"]


class ZeroParts:
    """Several ZeroOptimizers (one stage, disjoint parameters) behind ZeroOptimizer's interface."""

    def __init__(self, parts: list[ZeroOptimizer]):
        if not parts or len({p.stage for p in parts}) != 1:
            raise ValueError("ZeroParts joins one or more ZeroOptimizers of one stage")
        self.parts, self.stage = parts, parts[0].stage
        # One state mapping for every part's inner optimizer (each keyed by its own shard), so a
        # checkpoint reads and writes them as one optimizer's (dt.parallel.checkpoint.state).
        shared = parts[0].optimizer.state
        for p in parts[1:]:
            shared.update(p.optimizer.state)
            p.optimizer.state = shared
        self._joined = SimpleNamespace(state=shared, param_groups=self.param_groups)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for p in self.parts for g in p.param_groups]  # the parts' own dicts: lr set here holds

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parts:
            p.zero_grad(set_to_none)

    def reduce_gradients(self) -> None:
        for p in self.parts:
            p.reduce_gradients()

    def shard_gradients(self) -> list[torch.Tensor]:
        return [g for p in self.parts for g in p.shard_gradients()]

    def shard_pieces(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        return [piece for p in self.parts for piece in p.shard_pieces()]

    def step(self) -> None:
        for p in self.parts:
            p.step()

    def memory(self) -> dict[str, int]:
        held = [p.memory() for p in self.parts]
        out = _summed(held)
        out["optimizer"] = held[0]["optimizer"]  # each part reads the one shared state: every part's
        return out

    def formula(self, k: int = 8) -> dict[str, float]:
        return _summed([p.formula(k) for p in self.parts])

    def expected_bytes_sent(self, micro_batches: int = 1) -> int:
        return sum(p.expected_bytes_sent(micro_batches) for p in self.parts)

    def checkpoint_layout(self) -> dict[str, Any]:
        return self.parts[0].checkpoint_layout()  # the dense part's: the plane's size

    def checkpoint_pieces(self, pieces_of: Any) -> tuple[Any, list[Any]]:
        pieces = [piece for p in self.parts for piece in p.checkpoint_pieces(pieces_of)[1]]
        return self._joined, pieces


def _summed(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes held by the parts together; the collectives' scratch is one pool the parts reuse
    (dt.collectives.scratch): the largest, not the sum."""
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = max(out.get(k, 0), v) if k == "comm_scratch" else out.get(k, 0) + v
    return out
