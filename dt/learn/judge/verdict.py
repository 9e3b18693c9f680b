"""From what every rank returned and logged to one verdict that says what is wrong.

The kinds, worst first (a case gets the first that applies):

    import     the file does not import, or lacks the function
    forbidden  a collective was called inside the learner's code
    crash      a rank died (gloo aborts a process that receives a message
               larger than its buffer: the sizes of both sides are shown)
    hang       a rank neither returned nor waited on a message (its line is shown)
    error      the learner's code raised (rank, exception, line; and who was
               left waiting on that rank)
    deadlock   ranks waited on messages that never came: who waits on whom,
               the message's ordinal and size, and why it did not come
    unmatched  it returned, leaving a send or receive nobody matched
    wrong      the result differs from torch's: first differing element, rank
    traffic    right, but the busiest rank sent more than dt.cost's figure
               (more messages, where fewer messages is the point)
    ok

forbidden, crash, hang and deadlock end the world's run (`FATAL`): the processes are
restarted and, unless asked to keep going, its remaining cases are skipped.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dt.learn.judge.cases import JudgeCase, members
from dt.learn.judge.instrument import describe, ordinal
from dt.learn.judge.runner import RankLog
from dt.learn.judge.specs import Spec

__all__ = ["FATAL", "KINDS", "Context", "Verdict", "decide"]

KINDS = ("import", "forbidden", "crash", "hang", "error", "deadlock", "unmatched", "wrong", "traffic",
         "skipped", "ok")
FATAL = ("import", "forbidden", "crash", "hang", "deadlock")


@dataclass
class Verdict:
    kind: str
    message: str = ""
    traffic: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.kind == "ok"


@dataclass(frozen=True)
class Context:
    spec: Spec
    case: JudgeCase
    world: int
    algorithm: str  # the dt.cost algorithm whose traffic is the target
    timeout: float
    hang_after: float
    function: str
    filename: str  # the learner's file, as its lines are named ("ring.py")


@dataclass
class _Rank:
    status: str  # ok raised deadlock forbidden lost unfinished import idle | died hung killed
    result: dict[str, Any]
    posts: dict[int, dict[str, Any]]
    waiting: dict[str, Any] | None  # the post it was waiting on when it stopped
    log: RankLog


def _ranks(ctx: Context, results: list[Any] | None, failure: Any, logs: list[RankLog]) -> dict[int, _Rank]:
    out = {}
    for r in range(ctx.world):
        log = logs[r]
        posts = {e["id"]: e for e in log.events if e.get("e") == "post"}
        done = {e["id"] for e in log.events if e.get("e") == "done"}
        waits = [e["id"] for e in log.events if e.get("e") in ("wait", "stuck") and e["id"] not in done]
        waiting = posts.get(waits[-1]) if waits else None
        result = results[r] if results else {}
        if failure is None:
            status = result["status"]
        else:
            err = failure.errors.get(r)
            if err is None:  # it returned, but the pool keeps no results after a failure: read its log
                raised = [e for e in log.events if e.get("e") == "raise"]
                status = "raised" if raised else "ok" if r in members(ctx.case, ctx.world) else "idle"
                result = {"error": raised[-1]["error"]} if raised else {}
            elif err.kind == "died":
                status = "hung" if "Timeout (" in log.output else "died"
                result = {"why": err.message}
            elif err.kind == "stopped":
                status = "killed"
            else:  # the judge's own code failed on that rank
                status, result = "judge", {"error": f"{err.kind}: {err.message}\n{err.traceback}"}
        out[r] = _Rank(status, result, posts, waiting, log)
    return out


def _state(rank: int, s: _Rank, ctx: Context) -> str:
    """What a rank is doing, as a phrase: 'has returned', 'waits in recv from rank 1 (...)'."""
    if s.status in ("died",):
        return "crashed"
    if s.status == "hung":
        return "was busy in your code"
    if s.waiting is not None:
        return f"waits in {describe(s.waiting)}"
    if s.status in ("raised", "lost", "forbidden"):
        return f"raised {s.result.get('error') or 'an exception'}"
    if s.status == "idle":
        return "is not in the group"
    return f"has returned from {ctx.function}"


def _why(rank: int, op: dict[str, Any], ranks: dict[int, _Rank], ctx: Context) -> str:
    """Why the message `rank` waits on has not come: what its peer did."""
    peer = op["peer"]
    if peer is None or peer not in ranks:
        return ""
    other = ranks[peer]
    if op["kind"] == "recv":
        theirs = [e for e in other.posts.values()
                  if e["kind"] == "send" and e["peer"] == rank and e["tag"] == op["tag"]]
        if len(theirs) < op["k"]:
            sent = f"only {len(theirs)} message{'s' if len(theirs) != 1 else ''}" if theirs else "nothing"
            return f"; rank {peer} sent rank {rank} {sent} and {_state(peer, other, ctx)}"
        match = theirs[op["k"] - 1]
        return f"; rank {peer} posted that message ({match['bytes']:,} bytes) and {_state(peer, other, ctx)}"
    theirs = [e for e in other.posts.values()
              if e["kind"] == "recv" and e["peer"] in (rank, None) and e["tag"] == op["tag"]]
    if len(theirs) < op["k"]:
        got = f"only {len(theirs)}" if theirs else "no"
        return f"; rank {peer} posted {got} receives from rank {rank} and {_state(peer, other, ctx)}"
    return f"; rank {peer} posted the receive and {_state(peer, other, ctx)}"


def _waiting(ranks: dict[int, _Rank], ctx: Context) -> list[str]:
    lines, edges = [], {}
    for r, s in sorted(ranks.items()):
        if s.waiting is None or s.status in ("died", "hung"):
            continue
        op = s.waiting
        lines.append(f"rank {r} waits in {describe(op)}{_at(op)}{_why(r, op, ranks, ctx)}")
        if op["peer"] is not None:
            edges[r] = op["peer"]
    cycle = _cycle(edges)
    if cycle:
        lines.append("the waits form a cycle, " + " -> ".join(map(str, cycle)) + ": each rank waits on "
                     "the next, so no message can move (post a step's receive and send together, "
                     "irecv and isend, before waiting on either)")
    return lines


def _cycle(edges: dict[int, int]) -> list[int]:
    for start in sorted(edges):
        path, r = [], start
        while r in edges and r not in path:
            path.append(r)
            r = edges[r]
        if r in path:
            return path[path.index(r):] + [r]
    return []


def _mismatches(ranks: dict[int, _Rank]) -> list[str]:
    """Messages whose two sides disagree on the size (gloo matches them in posting order)."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, s in sorted(ranks.items()):
        for e in sorted(s.posts.values(), key=lambda e: e["id"]):
            if e["kind"] == "send":
                sends[(r, e["peer"], e["tag"])].append(e)
            elif e["peer"] is not None:
                recvs[(e["peer"], r, e["tag"])].append(e)
    out = []  # (a message larger than its buffer first: that one kills the receiver)
    for (i, j, tag), sent in sorted(sends.items(), key=lambda kv: kv[0]):
        for s, rv in zip(sent, recvs.get((i, j, tag), [])):
            if s["bytes"] != rv["bytes"]:
                effect = ("gloo aborts a process that receives more than its buffer holds"
                          if s["bytes"] > rv["bytes"] else "the rest of that buffer keeps its old contents")
                out.append((s["bytes"] < rv["bytes"],
                            f"rank {i}'s {ordinal(s['k'])} message to rank {j} is {s['bytes']:,} bytes"
                            f"{_at(s)}, but rank {j} receives it into {rv['bytes']:,} bytes{_at(rv)}: "
                            f"{effect}"))
                break
    return [text for _, text in sorted(out, key=lambda x: x[0])]


def _at(e: dict[str, Any]) -> str:
    return f" (at {e['at']})" if e.get("at") else ""


def _gloo_said(output: str) -> str:
    for line in reversed(output.splitlines()):
        if "enforce fail" in line or "what():" in line:
            return line.rsplit("] ", 1)[-1].strip()
    return ""


def _learner_frame(output: str, filename: str) -> str:
    m = re.search(r'File "[^"]*' + re.escape(filename) + r'", line (\d+) in (\w+)', output)
    return f"{filename}:{m.group(1)} in {m.group(2)}" if m else ""


def decide(ctx: Context, results: list[Any] | None, failure: Any, logs: list[RankLog]) -> Verdict:
    ranks = _ranks(ctx, results, failure, logs)
    by = defaultdict(list)
    for r, s in ranks.items():
        by[s.status].append(r)

    if by["import"]:
        return Verdict("import", ranks[by["import"][0]].result["error"])
    if by["judge"]:
        r = by["judge"][0]
        return Verdict("error", f"the judge itself failed on rank {r} (please report it): "
                                f"{ranks[r].result['error']}")
    if by["forbidden"]:
        r = by["forbidden"][0]
        return Verdict("forbidden", ranks[r].result.get("error") or f"rank {r} called a collective")
    if by["died"]:
        lines = []
        for r in by["died"]:
            s = ranks[r]
            during = f" while it waited in {describe(s.waiting)}{_at(s.waiting)}" if s.waiting else ""
            why = s.result.get("why", "")
            how = re.search(r"signal \w+", why) or re.search(r"code -?\d+", why)
            lines.append(f"rank {r} crashed ({how.group(0) if how else 'died'}){during}")
            said = _gloo_said(s.log.output)
            if said:
                lines.append(f"gloo said: {said}")
        lines = _mismatches(ranks)[:1] + lines + _waiting(ranks, ctx)
        return Verdict("crash", "\n".join(lines))
    if by["hung"]:
        lines = []
        for r in by["hung"]:
            where = _learner_frame(ranks[r].log.output, ctx.filename)
            lines.append(f"rank {r} neither returned nor waited on a message for {ctx.hang_after:g}s"
                         + (f"; it was at {where}" if where else "")
                         + " (a loop that never ends? a wait the judge cannot see?)")
        return Verdict("hang", "\n".join(lines + _waiting(ranks, ctx)))
    if by["raised"]:  # the cause; ranks left waiting on the raising one are its consequence
        errors = defaultdict(list)
        for r in by["raised"]:
            errors[ranks[r].result["error"]].append(r)
        lines = [f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} raised {e}"
                 for e, rs in errors.items()]
        return Verdict("error", "\n".join(lines + _waiting(ranks, ctx)))
    if by["deadlock"] or by["killed"] or by["lost"]:
        lines = _waiting(ranks, ctx)
        stuck = len([r for r in ranks.values() if r.waiting is not None])
        head = f"{stuck} rank{'s' if stuck != 1 else ''} still waiting after {ctx.timeout:g}s:"
        return Verdict("deadlock", "\n".join([head] + lines))
    if by["unfinished"]:
        lines = []
        for r in by["unfinished"]:
            for e in ranks[r].result["unfinished"]:
                nobody = "received" if e["kind"] == "send" else "sent"
                lines.append(f"rank {r}'s {describe(e)}{_at(e)} never completed: nobody {nobody} it "
                             "(every send needs a matching receive on its peer)")
        return Verdict("unmatched", "\n".join(lines))
    return _right_and_cheap(ctx, ranks)


def _right_and_cheap(ctx: Context, ranks: dict[int, _Rank]) -> Verdict:
    group = members(ctx.case, ctx.world)
    wrong = [r for r in group if ranks[r].result.get("difference")]
    traffic = _traffic(ctx, {ranks[r].result["group_rank"]: ranks[r].result["traffic"] for r in group})
    notes = _mismatches(ranks)[:1]
    if wrong:
        r = wrong[0]
        d = ranks[r].result["difference"]
        if "problem" in d:
            text = f"rank {r}: {d['problem']}"
        else:
            hint = f" ({d['hint']})" if d.get("hint") else ""
            text = (f"rank {r}: {d['where']} is {_num(d['got'])}, expected {_num(d['expected'])}{hint}; "
                    f"{d['wrong']} of {d['of']} elements differ from torch's {ctx.spec.name} "
                    "on the same inputs")
        if len(wrong) > 1:
            text += f"; wrong on ranks {', '.join(map(str, wrong))}"
        return Verdict("wrong", text, traffic, notes)
    if traffic["over"]:
        return Verdict("traffic", traffic["message"], traffic, notes)
    if traffic.get("note"):
        notes.append(traffic["note"])
    return Verdict("ok", "", traffic, notes)


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _traffic(ctx: Context, measured: dict[int, dict[str, int]]) -> dict[str, Any]:
    """The busiest rank and all ranks together, measured against dt.cost's figure."""
    p, alg = len(measured), ctx.algorithm
    target = {g: ctx.spec.target(ctx.case, p, g, alg) for g in measured}
    sent = {g: m["bytes_sent"] for g, m in measured.items()}
    msgs = {g: m["messages_sent"] for g, m in measured.items()}
    busiest = max(sent, key=lambda g: (sent[g], -g))
    t_busiest = max(t.bytes_sent for t in target.values())
    t_msgs = max(t.messages_sent for t in target.values())
    # One element per message of slack: the rounding any split into chunks can cause.
    slack = t_msgs * ctx.spec.itemsize(ctx.case)
    total, t_total = sum(sent.values()), sum(t.bytes_sent for t in target.values())
    most_msgs = max(msgs.values())
    out: dict[str, Any] = {
        "algorithm": alg, "bytes_sent": sent, "messages_sent": msgs,
        "target_bytes_sent": {g: t.bytes_sent for g, t in target.items()},
        "target_messages_sent": {g: t.messages_sent for g, t in target.items()},
        "busiest": sent[busiest], "target_busiest": t_busiest, "total": total, "target_total": t_total,
        "over": False, "message": "",
    }
    figure = f"dt.cost.traffic_for({ctx.spec.name!r}, {alg!r}, ...)"
    if total > t_total or sent[busiest] > t_busiest + slack:
        ratio = sent[busiest] / t_busiest if t_busiest else float("inf")
        out.update(over=True, message=(
            f"right, but group rank {busiest} sent {sent[busiest]:,} bytes in {msgs[busiest]} messages "
            f"where the {alg} algorithm's busiest rank sends {t_busiest:,} ({ratio:.2f}x; {figure}); "
            f"all ranks together {total:,} bytes against {t_total:,}"))
    elif most_msgs > t_msgs:
        g = max(msgs, key=msgs.get)
        empty = measured[g].get("empty_sent", 0)
        why = f"; {empty} of them empty: an empty chunk needs no message" if empty else ""
        text = (f"more messages than the {alg} algorithm sends (group rank {g}: {most_msgs} where it "
                f"sends {t_msgs}{why}); every message pays the latency (alpha) once")
        if ctx.spec.messages_matter:
            buckets = len(ctx.spec.buckets(ctx.case))  # type: ignore[attr-defined]
            out.update(over=True, message=f"right, but {text}: {buckets} bucket"
                                          f"{'s' if buckets != 1 else ''}, one ring all-reduce each")
        else:
            out["note"] = text
    return out
