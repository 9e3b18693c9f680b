"""What the study measures and how often: the original design's sizes, or smaller ones.

StudySettings() is the full study (reference.py's sizes, about 10 minutes on 2
cores); quick_settings() the smoke test CI runs; the command line (cli.py)
changes single fields. shrinkage() says, in words, how far a run is from the
original design's tables (docs/original_design.md), so a smaller figure is never
mistaken for a like-for-like one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dt.bench.scaling import reference as ref
from dt.bench.scaling.tables import ALL_TABLES, needs_of

__all__ = ["StudySettings", "quick_settings"]


@dataclass
class StudySettings:
    """What one scaling study measures: its tables, worlds, sizes and repetitions."""

    tables: tuple[int, ...] = ALL_TABLES
    quick: bool = False
    # collectives (tables 1, 2, 7)
    coll_worlds: tuple[int, ...] = ref.COLL_WORLDS
    big_bytes: int = ref.T1_BYTES
    small_bytes: int = ref.T2_BYTES
    sweep_bytes: tuple[int, ...] = (4096, 32768, 2 << 20, 8 << 20)  # + the two above, for table 7
    coll_reps: int = 5
    coll_warmup: int = 1
    # data parallel (tables 3, 4, 5)
    dp_worlds: tuple[int, ...] = ref.DP_WORLDS
    dp_batch: int = ref.DP_BATCH
    sweep_batches: tuple[int, ...] = ref.SWEEP_BATCHES
    hidden: int = ref.HIDDEN
    layers: int = ref.LAYERS
    dp_steps: int = 3  # timed steps per configuration (configurations interleaved)
    dp_warmup: int = 1
    dp_algorithm: str = "auto"
    torch_ddp: bool = True
    # pipeline (tables 5, 6)
    pp_stages: int = ref.PP_STAGES
    pp_micro: tuple[int, ...] = ref.PP_MICRO
    pp_batch: int = 1024
    pp_hidden: int = 1024
    pp_blocks_per_stage: int = 2
    pp_steps: int = 3
    pp_warmup: int = 1
    pp_virtual: int = 2  # chunks per rank of the interleaved schedule (if dt.pipeline has it)
    pp_timed_s: float = 0.02  # forward seconds of a TimedStage (backward 2x); 0: skip those rows
    # expert parallel (table 8): one MoE layer, ep = world, each rank its own tokens
    moe_worlds: tuple[int, ...] = (1, 2, 4)
    moe_tokens: int = 2048  # per rank
    moe_hidden: int = 128  # experts are hidden -> 2 hidden -> hidden
    moe_experts: int = 8
    moe_top_ks: tuple[int, ...] = (1, 2)
    moe_capacity: float = 1.0
    moe_reps: int = 3
    # context parallel (table 9): causal attention, sequence split (zig-zag) over cp ranks
    cp_worlds: tuple[int, ...] = (2, 4)
    cp_seq_lens: tuple[int, ...] = (512, 1024, 2048)
    cp_heads: int = 4
    cp_head_dim: int = 32
    cp_reps: int = 3
    # output
    out_dir: Path = Path("results")
    plots: bool = True
    update_readme: bool = False
    timeout: float = 600.0
    backend: str = "gloo"  # the process groups' backend: gloo on the CPU, nccl on GPUs

    def coll_reps_for(self, nbytes: int) -> int:
        """Small messages are cheap and noisy: four times the repetitions up to 1 MB."""
        return 4 * self.coll_reps if nbytes <= 1 << 20 else self.coll_reps

    def dp_steps_for(self, batch: int) -> int:
        """Timed steps at this batch: one number for every batch, asked per batch so a big one could
        take fewer."""
        return self.dp_steps

    @property
    def sweep_world(self) -> int:
        return max(self.dp_worlds)

    def worlds_used(self) -> list[int]:
        """Every world size the selected tables start a pool for."""
        return sorted(needs_of(self).worlds())

    def shrinkage(self) -> list[str]:
        """What this run measures smaller than the original design did, in words.

        Setting by setting, against the original design's tables 1-7 (which is
        why the table numbers are written out: a new table has no original to
        shrink from).
        """
        notes, tables = [], set(self.tables)
        if tables & {3, 5} and self.dp_batch != ref.DP_BATCH:
            notes.append(f"table 3 uses global batch {self.dp_batch} (the original design: "
                         f"{ref.DP_BATCH}) so the study fits in minutes on this machine; pass "
                         f"--dp-batch {ref.DP_BATCH} for the reference size")
        lo, hi = min(ref.SWEEP_BATCHES), max(ref.SWEEP_BATCHES)
        if 4 in tables and (min(self.sweep_batches) > lo or max(self.sweep_batches) < hi):
            notes.append(f"table 4 sweeps global batch {min(self.sweep_batches)}.."
                         f"{max(self.sweep_batches)} (the original design: {lo}..{hi})")
        if tables & {3, 4, 5} and (self.hidden != ref.HIDDEN or self.layers != ref.LAYERS):
            notes.append(f"the data-parallel model is {self.layers} layers of {self.hidden} "
                         f"(the reference: {ref.LAYERS} of {ref.HIDDEN})")
        if tables & {1, 7} and self.big_bytes != ref.T1_BYTES:
            notes.append(f"table 1 all-reduces {self.big_bytes / 1e6:.2f} MB (the reference: "
                         f"{ref.T1_BYTES / 1e6:.2f} MB)")
        if tables & {2, 7} and self.small_bytes != ref.T2_BYTES:
            notes.append(f"table 2 all-reduces {self.small_bytes / 1e6:.2f} MB (the reference: "
                         f"{ref.T2_BYTES / 1e6:.2f} MB)")
        if tables & {1, 2, 7} and max(self.coll_worlds) < max(ref.COLL_WORLDS):
            notes.append(f"collectives at world sizes {', '.join(map(str, self.coll_worlds))} "
                         f"(the reference: {', '.join(map(str, ref.COLL_WORLDS))})")
        if tables & {3, 4, 5} and max(self.dp_worlds) < max(ref.DP_WORLDS):
            notes.append(f"data parallel at world sizes {', '.join(map(str, self.dp_worlds))} "
                         f"(the reference: {', '.join(map(str, ref.DP_WORLDS))})")
        reps = []
        if tables & {1, 2, 7}:
            reps.append(f"{self.coll_reps} per collective after {self.coll_warmup} warm-up "
                        f"({4 * self.coll_reps} up to 1 MB)")
        if tables & {3, 4, 5}:
            big = [b for b in {self.dp_batch, *self.sweep_batches}
                   if self.dp_steps_for(b) != self.dp_steps]
            reps.append(f"{self.dp_steps} steps per data-parallel configuration after "
                        f"{self.dp_warmup} warm-up" + (f" ({self.dp_steps_for(max(big))} at global "
                                                       f"batch {max(big)})" if big else ""))
        if tables & {5, 6}:
            reps.append(f"{self.pp_steps} steps per pipeline configuration after "
                        f"{self.pp_warmup} warm-up")
        if tables & {8, 9}:
            reps.append(f"{self.moe_reps} (table 8) and {self.cp_reps} (table 9) per layer "
                        "configuration after 1 warm-up")
        if reps:
            notes.append("repetitions: " + "; ".join(reps))
        return notes


def quick_settings(s: StudySettings) -> StudySettings:
    """--quick: every table, small sizes, few repetitions, no world 8 (a smoke test)."""
    s.quick = True
    s.coll_worlds = (2, 4)
    s.big_bytes = 8 << 20
    s.sweep_bytes = (4096, 1 << 20)
    s.coll_reps, s.coll_warmup = 3, 1
    s.dp_worlds = (1, 2, 4)
    s.dp_batch = 512
    s.sweep_batches = (256, 1024)
    s.hidden = 512
    s.dp_steps, s.dp_warmup = 2, 1
    s.pp_micro = (1, 4, 16)
    s.pp_batch, s.pp_hidden = 512, 512
    s.pp_timed_s = 0.01
    s.pp_steps, s.pp_warmup = 2, 1
    s.moe_tokens, s.moe_hidden, s.moe_reps = 512, 64, 2
    s.cp_worlds, s.cp_seq_lens, s.cp_reps = (2,), (256, 512), 2
    return s
