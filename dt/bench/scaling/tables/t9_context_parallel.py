"""Table 9: context parallelism, Ulysses vs ring attention vs none at growing sequence length.

Causal attention forward and backward over a sequence split (zig-zag) over
cp ranks: ring attention (dt.parallel.context.ring_attention: k/v blocks
around the ring, the online softmax) and Ulysses (two all-to-alls between
sequence-sharded and head-sharded), against the whole sequence on one process.
Bytes per rank are what the transport counted, next to dt.cost's model
(dt.cost.ring_attention_traffic, dt.cost.ulysses_traffic).
"""

from __future__ import annotations

from typing import Any

from dt.bench import report as R
from dt.bench.scaling.layer_workers import attention_worker
from dt.bench.scaling.tables.base import Needs, Results, Run, Table, TableSpec, contention_notes

TITLE = "Context parallel: Ulysses vs ring attention vs one process, growing sequence length"


def label(cp: int) -> str:
    return f"attention cp={cp}"


def needs(s: Any) -> Needs:
    return Needs(runs={label(cp): Run(cp, attention_worker, (s.cp_seq_lens, 1, s.cp_heads, s.cp_head_dim,
                                                          s.cp_reps, 1))
                       for cp in s.cp_worlds})


def _row(per_rank: list[list[dict[str, float]]], S: int, method: str, cp: int,
         base: float | None) -> tuple[list[Any], dict[str, Any]]:
    step = R.Stat.of(R.per_rep_max([[x["step"] for x in r] for r in per_rank]))
    comm = R.Stat.of(R.per_rep_max([[x["comm"] for x in r] for r in per_rank]))
    sent = [r[0]["bytes_sent"] for r in per_rank]
    model = [r[0]["model"] for r in per_rank]
    row = [S, method, cp, R.fmt_bytes(max(sent)), R.fmt_bytes(max(model)),
           max(r[0]["messages_sent"] for r in per_rank), R.fmt_stat_time(comm), R.fmt_stat_time(step),
           R.fmt_ratio(base / step.median) if base else "-"]
    return row, {"seq_len": S, "method": method, "cp": cp, "ranks": 1 if method == "none" else cp,
                 "bytes_sent_per_rank": sent,
                 "model_per_rank": model, "step": step, "comm": comm}


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    for S in s.cp_seq_lens:
        for cp in s.cp_worlds:
            res = st.runs.get(label(cp))
            base = None  # each run times its own one-process baseline, minutes from its rows
            for method in ("none", "ring", "ulysses"):
                per_rank = [r[(method, S)] for r in res if (method, S) in r] if res is not None else []
                if not per_rank:
                    rows.append([S, method, cp, "not measured"] + ["-"] * 5)
                    continue
                row, entry = _row(per_rank, S, method, cp, base)
                if method == "none":
                    base = entry["step"].median
                    row[-1] = "1.00x"
                rows.append(row)
                data.append(entry)
    notes = [f"causal attention, 1 sequence x {s.cp_heads} heads x head dim {s.cp_head_dim}, float32, "
             "forward + backward (dt.parallel.context's block arithmetic everywhere); ring and Ulysses "
             "on cp ranks holding zig-zag shares of the sequence (2 cp chunks), 'none' on one process "
             "(rank 0 alone, the others idle, in the same run as the cp rows below it, with the "
             "methods taking turns) cutting the sequence into the same chunks and skipping the "
             "masked chunk pairs, so all do the same arithmetic. One thread per rank. Median over "
             "repetitions of the slowest rank.",
             "bytes/rank: the most any rank sent, forward and backward; dt.cost: "
             "ring_attention_traffic / ulysses_traffic for the same split. Even split, n = one of "
             "q, k, v on a rank (1/cp of the sequence): ring 2(cp-1)n forward + 4(cp-1)n backward, "
             "about 6 b S H d itemsize whatever cp; Ulysses 4(cp-1)/cp n each way, falling as 1/cp.",
             "comm: seconds blocked on the ring's hops or Ulysses' all-to-alls (compute the ring "
             "overlaps with its hop is not counted). speedup: one process's time over this one's."]
    notes += contention_notes(s.cp_worlds, st.cores)
    headers = ["sequence", "method", "run (cp)", "bytes/rank", "dt.cost", "messages/rank", "comm",
               "fwd+bwd", "speedup"]
    return Table(9, TITLE, headers, rows, notes, data)


SPEC = TableSpec(9, TITLE, needs, build)
