"""The proof's second half, for the built-in trainer: every iteration's gradients reached collectives.

The links' half (testbed.runs.proof) shows that what each rank handed to torch.distributed
crossed the shaped links; it cannot show that this was the gradients. A run that averaged
its gradients some other way (through files, its own sockets) and all-reduced only its
loss hands a few bytes a step, and those few bytes cross the links. For the built-in
schemes testbed knows what must travel: each rank of ``workloads.train`` records per
iteration (``workloads.volume``, in its collectives file) the gradient elements DDP handed
the scheme's hook, the fewest bytes the scheme's collectives must carry for them
(``workloads.schemes.floors``) and the bytes its collectives carried (torch's flight
recorder, by creation time). The check, every rank and every iteration:

    handed    DDP handed the hook all of the model's trainable elements (``allreduce`` has no
              hook: DDP's reducer all-reduces every bucket itself)
    carried   >= floor: the collectives carried at least what the scheme must send for them

The first iteration that fails either makes the run ``unproven``, named in one line (rank,
iteration, shortfall). What cannot be checked is said, never passed over in silence: your
own script or module (no volume: the proof sees its collectives only), your own hook (no
floor is known for it), iterations whose recorder entries were lost (not checked, counted).
"""

from __future__ import annotations

MAX_ITERATIONS = 1_000_000

USER_CODE = ("your own code: the proof sees only the bytes it hands to torch.distributed; that its gradients "
             "were exchanged at all is not checked (an exchange through files or its own sockets beside small "
             "collectives is not caught)")
OWN_HOOK = ("your own hook: no floor is known for what it must send; that every iteration's gradients reached "
            "a collective is not checked")
OTHER_MODULE = ("not the built-in trainer (another of testbed's workloads): the proof sees only the bytes it hands "
                "to torch.distributed; no gradient volume is checked")
WORKLOADS = ("trainer", "code", "module")
"""What the ranks ran: the built-in trainer, your own script or module, another of testbed's modules."""


def parse(doc: dict, rank: int = 0) -> dict | None:
    """A rank's ``volume`` (None when its file has none), checked field by field (ValueError
    or TypeError when it is not as workloads.volume writes it) and judged at once, so that only
    its digest is kept: ``scheme``, ``checked``, ``elements``, ``iterations`` (checked),
    ``lost`` (not checked), ``short`` (its first failing iteration: (index, rank, what fell
    short); None when none) and ``nshort`` (how many failed)."""
    v = doc.get("volume")
    if v is None:
        return None
    if not isinstance(v, dict) or not isinstance(v.get("scheme"), str) or not isinstance(v.get("checked"), bool):
        raise ValueError("volume")
    scheme, n = v["scheme"][:100], _int(v.get("elements"))
    floor, carried = _ints(v.get("floor")), _ints(v.get("carried"))
    handed = None if v.get("handed") is None else _ints(v["handed"])
    lost = set(_ints(v.get("lost")))
    if len(carried) != len(floor) or (handed is not None and len(handed) != len(floor)):
        raise ValueError("volume: lists of different lengths")
    short = _short(scheme, n, floor, carried, handed, lost) if v["checked"] else iter(())
    first = next(short, None)  # the first failing iteration, and how many more: not every line
    gone = sum(1 for i in lost if i < len(floor))
    return {"scheme": scheme, "checked": v["checked"], "elements": n, "iterations": len(floor) - gone, "lost": gone,
            "short": None if first is None else (first[0], rank, first[1]),
            "nshort": (first is not None) + sum(1 for _ in short)}


def _int(v) -> int:
    if type(v) is not int or not 0 <= v < 10**18:
        raise ValueError(f"not a count: {v!r:.40}")
    return v


def _ints(v) -> list[int]:
    if not isinstance(v, list) or len(v) > MAX_ITERATIONS:
        raise ValueError("not a list of counts")
    return [_int(x) for x in v]


def _short(scheme: str, n: int, floor: list[int], carried: list[int], handed: list[int] | None, lost: set[int]):
    """(iteration index, what fell short) for each failing iteration of one rank."""
    for i, (f, c) in enumerate(zip(floor, carried)):
        if i in lost:
            continue
        h = handed[i] if handed is not None else n
        if h < n:
            yield i, (f"DDP handed {scheme}'s hook {h:,} of the model's {n:,} gradient elements: {n - h:,} never "
                      "reached a collective")
        elif c < f:
            yield i, f"its collectives carried {c:,} bytes, {f - c:,} short of the {f:,} bytes {scheme} must move for " \
                     f"its {n:,} gradient elements"


def judge(volumes: dict[int, dict | None], workload: str = "code") -> dict:
    """``volumes``: rank -> its digest (:func:`parse`; None: none in its file); ``workload``
    (:data:`WORKLOADS`): what the ranks ran (the built-in trainer's must each have one). The
    check's result:
    ``checked``, ``scheme``, ``elements``, ``iterations`` (checked, per rank), ``lost`` (not
    checked, all ranks), ``reason`` (the first shortfall, one line; empty when none) and
    ``note`` (what was not checked, and why)."""
    out = {"checked": False, "scheme": None, "elements": None, "iterations": 0, "lost": 0, "reason": "", "note": ""}
    absent = sorted(r for r, v in volumes.items() if v is None)
    if len(absent) == len(volumes):
        if workload == "trainer":
            out["reason"] = (f"rank(s) {_list(absent)} left no gradient volume (the trainer records one in its "
                             "collectives file): that the gradients reached the collectives is not shown")
        else:
            out["note"] = USER_CODE if workload == "code" else OTHER_MODULE
        return out
    if absent:
        out["reason"] = f"rank(s) {_list(absent)} left no gradient volume, which the others recorded"
        return out
    digests = [v for _, v in sorted(volumes.items()) if v is not None]
    out.update(scheme=digests[0]["scheme"], elements=digests[0]["elements"])
    if not all(v["checked"] for v in digests):
        out["note"] = OWN_HOOK if digests[0]["scheme"] == "hook" else f"scheme {digests[0]['scheme']}: no floor is known"
        return out
    out.update(checked=True, iterations=max(v["iterations"] for v in digests), lost=sum(v["lost"] for v in digests))
    short = [v["short"] for v in digests if v["short"] is not None]
    nshort = sum(v["nshort"] for v in digests)
    if not out["iterations"]:
        out["reason"] = "no training iteration of any rank could be checked (none made, or their counts were lost)"
    elif short:
        i, r, said = min(short)
        more = f" (and {nshort - 1} more rank-iterations short)" if nshort > 1 else ""
        out["reason"] = f"rank {r} iteration {i + 1}: {said}{more}"
    return out


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def promise(summary: dict) -> list[tuple[str, str]]:
    """What the run's proof shows and what it does not, for the run's table (summary.json's
    ``proof`` and ``proof_gradients``): rows of (label, text)."""
    g = summary.get("proof_gradients")
    if not isinstance(g, dict) or summary.get("proof") != "passed":
        return []
    links = "the bytes every rank handed to torch.distributed crossed the shaped links (each link >= its bound)"
    if g.get("checked") is True:
        lost, n = (v if type(v) is int else 0 for v in (g.get("lost"), g.get("elements")))
        return [("proven", f"{links}; every iteration's {n:,} gradient elements reached "
                           f"{g.get('scheme')}'s collectives, carrying at least what it must send"
                           + (f" ({lost} rank-iterations with lost counts not checked)" if lost else ""))]
    return [("proven", links), ("not proven", str(g.get("note") or "the gradients' volume"))]
