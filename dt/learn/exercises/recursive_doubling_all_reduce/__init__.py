"""Exercise: recursive-doubling all-reduce, lg p steps where the ring takes 2(p-1)."""

import textwrap

from dt import cost
from dt.learn.exercises import Exercise
from dt.learn.quiz import ALPHA, BANDWIDTH
from dt.units import fmt_time, parse_rate, parse_size, parse_time

WORLD = 8


def _time(algorithm: str, size: str) -> str:
    """The cost model's all-reduce time on the chapter's machine (the quiz's), as `dt model` prints it."""
    e = cost.estimate("all_reduce", algorithm, parse_size(size), WORLD, alpha=parse_time(ALPHA),
                      beta=1 / parse_rate(BANDWIDTH))
    return fmt_time(e.total)


EXERCISE = Exercise(
    name="recursive_doubling_all_reduce",
    title="Recursive-doubling all-reduce: lg p steps where the ring takes 2(p-1)",
    function="all_reduce",
    collective="all_reduce",
    target="recursive_doubling",
    see=f"dt model all_reduce --size 1KB,1MB,1GB --world {WORLD} --bandwidth {BANDWIDTH} --latency {ALPHA}"
        "   (where doubling beats the ring, and where naive beats both)",
    statement=textwrap.fill(
        "The ring pays 2(p-1) steps of latency; for a small tensor that is most of what it costs. "
        "Recursive doubling takes lg p steps: at distance d = 1, 2, 4, ... rank r exchanges its whole "
        "tensor with rank r XOR d and reduces, so after the step at distance d every rank holds the "
        "reduction over its aligned group of 2d ranks. More bytes (the whole tensor every step), far "
        f"fewer steps. On {WORLD} ranks at {ALPHA} a step and {BANDWIDTH} (the quiz's machine), the cost "
        f"model puts a 1 MB all-reduce at {_time('recursive_doubling', '1MB')} this way against the "
        f"ring's {_time('ring', '1MB')}. At 1 KB naive is faster still ({_time('naive', '1KB')} against "
        f"{_time('recursive_doubling', '1KB')}: two steps, every tensor through one root), as the quiz's "
        "last question asks: the fewest steps win until the bytes count.", 76) + """

Write all_reduce(tensor, op=ReduceOp.SUM, group=None) this way, for any p,
not only powers of two: with p' the largest power of two <= p and
e = p - p', let the first 2e ranks pair up (0,1), (2,3), ...: the even one
hands its tensor to the odd one and sits out; the p' others run the
doubling as virtual ranks 0 .. p'-1; at the end each odd rank hands the
result back (MPICH's fold: two more steps). The judge holds your bytes to
this algorithm's figure.""",
    hints=(
        "dt.layout.Fold(p, r) is the fold: .vrank (None for a rank that sits out), .partner, "
        ".folded, .p2, and .real(v), the rank playing virtual rank v.",
        "Partner at distance d: fold.real(fold.vrank ^ d), for d = 1, 2, 4, ... while d < fold.p2.",
        "Exchange with isend + irecv into a second buffer, wait on both, then reduce: never reduce "
        "into the tensor you are still sending.",
        "AVG: divide once, after the last doubling step and before handing the result back.",
    ),
)
