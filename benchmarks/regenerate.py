"""Rebuild the generated blocks of the documentation's pages from their committed records.

    python -m benchmarks.regenerate [--check] [NAME...]

A page (``docs/*.md``, ``docs/results/*.md``, any page under ``docs/`` but the records
themselves) holds a generated block between two HTML comments::

    <!-- regenerate: strong_scaling records=strong-scaling-2026-11-27 -->
    ... (written by this command: do not edit) ...
    <!-- /regenerate -->

A marker counts at the start of a line outside fenced code (where pages show it as an
example). ``strong_scaling`` names a generator (``GENERATORS``: a function of the records folder that
returns markdown) and ``records`` a folder under ``docs/results/records/`` that
``benchmarks.archive`` made. The block becomes the generator's markdown and a line naming
the records: their runs, the code they ran, the machine and the command that archived them.

Without ``--check`` every block is rewritten (a page whose blocks are unchanged is left
alone). With ``--check`` nothing is written, and the command exits 1 naming each page and
block that disagrees with its records, with a short diff. ``NAME...`` limits either to the
blocks whose generator or records folder is one of them. A block naming an unknown
generator, a missing records folder or an option other than ``records``, or a marker
without its end, is a one-line error (exit 1).

The records are read as ``testbed report`` reads run directories
(``testbed.runs.reports.report.find_runs``, through ``benchmarks.archive.runs_of``).
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks import (claims_seeds, claims_tables, cli_tables, efficiency_tables, gpu_tables, network_tables,
                        ops_tables, paper_scale, proof_tables, strong_scaling, training_tables)
from benchmarks.archive import RECORDS, read_results, reading_once, runs_of
from benchmarks.machine import line as describe_machine
from testbed.common.errors import TestbedError
from testbed.common.files import InputError, atomic_write, read_json, read_jsonl
from testbed.runs.reports.report import RunData

DOCS = RECORDS.parents[1]
OPEN = re.compile(r"^<!-- regenerate: (?P<spec>.*?) -->[ \t]*$", re.M)
CLOSE = "<!-- /regenerate -->"
DIFF_LINES = 20


def _ok(folder: Path) -> list[RunData]:
    return [r for r in runs_of(folder) if r.status == "ok"]


def dilation(folder: Path) -> str:
    """docs/dilation.md's measured table, from benchmarks.dilation's runs: per K, the median
    over the runs of each run's median steady iteration (rank 0, the first left out), its
    min-max, the ratio to the smallest K's, and the run's wall-clock seconds (run_s x K)."""
    per_k: dict[float, list[tuple[float, float]]] = {}
    for r in _ok(folder):
        its = [x["iter_s"] for x in read_jsonl(r.path / "rank0.jsonl") if isinstance(x.get("iter_s"), (int, float))]
        k = r.summary.get("dilation") or 1
        if len(its) > 1:
            per_k.setdefault(k, []).append((statistics.median(its[1:]), (r.summary.get("run_s") or 0) * k))
    if not per_k:
        raise TestbedError(f"{folder}: no run with two iterations or more", "archive benchmarks.dilation's runs")
    base = statistics.median(t for t, _ in per_k[min(per_k)])
    out = ["| K | runs | median iteration ms | min-max | / K=1 | wall s per run |",
           "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k, xs in sorted(per_k.items()):
        ts = [t * 1000 for t, _ in xs]
        m = statistics.median(ts)
        out.append(f"| {k:g} | {len(xs)} | {m:.1f} | {min(ts):.1f}-{max(ts):.1f} | {m / 1000 / base:.3f} | "
                   f"{statistics.median(w for _, w in xs):.1f} |")
    return "\n".join(out) + "\n"


def gpu_speed(folder: Path) -> str:
    """docs/dilation.md's --gpu-time against --compute-time table, from benchmarks.gpu_speed's
    runs: per mode, the median over the runs of each run's median steady iteration (rank 0,
    the first left out), its min-max, the ratio to the paper-scale mode's, the overruns, the
    proofs and what accuracy was measured."""
    modes: dict[str, list[RunData]] = {}
    for r in _ok(folder):
        mode = "direct (--gpu-time)" if r.summary.get("gpu_time_s") is not None else "paper-scale (--compute-time)"
        modes.setdefault(mode, []).append(r)
    med: dict[str, list[float]] = {}
    for mode, runs in modes.items():
        for r in runs:
            its = [x["iter_s"] for x in read_jsonl(r.path / "rank0.jsonl") if isinstance(x.get("iter_s"), (int, float))]
            med.setdefault(mode, []).append(statistics.median(its[1:]) * 1000)
    base = statistics.median(med.get("paper-scale (--compute-time)") or [math.nan])
    out = ["| mode | runs | median iteration ms | min-max | / paper-scale | overruns | proofs | final accuracy |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for mode, runs in sorted(modes.items()):
        ts, m = med[mode], statistics.median(med[mode])
        over = [r.summary.get("overruns") for r in runs]
        accs = [r.summary.get("final_accuracy") for r in runs]
        out.append(f"| {mode} | {len(runs)} | {m:.1f} | {min(ts):.1f}-{max(ts):.1f} | {m / base:.3f} | "
                   f"{sum(over) if None not in over else '-'} | "
                   f"{', '.join(sorted({str(r.summary.get('proof')) for r in runs}))} | "
                   f"{'not measured' if None in accs else f'{statistics.median(accs):.3f}'} |")
    return "\n".join(out) + "\n"


def memory(folder: Path) -> str:
    """One row per run: what it ran, at how many ranks and which K, whether it was proven,
    and the memory it held (the largest models that fit, docs/results/scaling.md)."""
    out = ["| model | width | parameters (M) | gradients MB | ranks | K | proof | median iteration ms | "
           "RSS per rank MB | PSS all ranks GB |", "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    runs = sorted(runs_of(folder), key=lambda r: r.summary.get("dense_bytes") or 0)
    for r in runs:
        s = r.summary
        width = (s.get("hyper") or {}).get("width") or 1
        grads = s.get("dense_bytes") or 0
        out.append(f"| {s.get('model')} | {width:g} | {grads / 4e6:.2f} | {grads / 1e6:.1f} | {s.get('world_size')} | "
                   f"{s.get('dilation') or 1:g} | {s.get('proof') or s.get('status')} | "
                   f"{(s.get('median_iter_s') or 0) * 1000:.1f} | {(s.get('max_rss_bytes_per_rank') or 0) / 1e6:.0f} | "
                   f"{(s.get('pss_bytes_all_ranks') or 0) / 1e9:.2f} |")
    return "\n".join(out) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {
    "memory": memory,
    "strong_scaling": lambda folder: strong_scaling.markdown(_ok(folder)),
    "strong_scaling_validation": lambda folder: strong_scaling.validation_markdown(_ok(folder)),
    "dilation": dilation,
    "gpu_speed": gpu_speed,
    "claims_pactrain": claims_tables.pactrain_claims,
    "claims_tta": claims_tables.tta_table,
    "claims_prune": claims_tables.prune_table,
    "claims_prunex": claims_seeds.prunex_claims,
    "claims_prunex_table": claims_seeds.prunex_table,
    "claims_prunex_bn": lambda folder: claims_seeds.prunex_claims(folder, section="prunex_bn"),
    "claims_spardl": claims_seeds.spardl_claims,
    "claims_spardl_table": claims_seeds.spardl_table,
    "spardl_ranks": claims_seeds.spardl_ranks_table,
    "claims_lr": claims_seeds.lr_table,
    "claims_scaling": claims_seeds.scaling_claims,
    "efficiency": efficiency_tables.pactrain_table,
    "efficiency_prunex": efficiency_tables.prunex_table,
    "efficiency_ternary": efficiency_tables.ternary_table,
    **{f"paper_scale_{bw}": (lambda folder, bw=bw: paper_scale.markdown(_ok(folder), bw))
       for bw in paper_scale.BWS},
    "paper_scale_speedups": lambda folder: paper_scale.speedups_markdown(_ok(folder)),
    **network_tables.GENERATORS,
    **ops_tables.GENERATORS,
    **proof_tables.GENERATORS,
    **cli_tables.GENERATORS,
    **training_tables.GENERATORS,
    **gpu_tables.GENERATORS,
}
"""name -> function(records folder) -> markdown."""


class Block:
    """One generated block of a page: its generator, records folder and text."""

    def __init__(self, page: Path, m: re.Match, text: str):
        self.page, self.line = page, text.count("\n", 0, m.start()) + 1
        self.spec, self.start = m["spec"].strip(), m.end() + 1
        where = f"{page}:{self.line}"
        end = text.find(CLOSE, m.end())
        nxt = next((n for n in OPEN.finditer(text, m.end()) if not _fenced(text, n.start())), None)
        if end < 0 or (nxt and nxt.start() < end):
            raise TestbedError(f"{where}: `<!-- regenerate: {self.spec} -->` has no `{CLOSE}` after it",
                               "end every generated block with its marker")
        self.end, self.body = end, text[self.start:end]
        words = self.spec.split()
        self.generator = words[0] if words else ""
        opts = dict(w.partition("=")[::2] for w in words[1:])
        if self.generator not in GENERATORS:
            raise TestbedError(f"{where}: unknown generator {self.generator!r}; choose one of: "
                               f"{', '.join(sorted(GENERATORS))}")
        if set(opts) != {"records"} or not opts["records"]:
            raise TestbedError(f"{where}: a block takes records=NAME and nothing else, not {self.spec!r}")
        self.records = opts["records"]

    def render(self, records: Path) -> str:
        folder = records / self.records
        if "/" in self.records or self.records in (".", "..") or not folder.is_dir():
            raise TestbedError(f"{self.page}:{self.line}: no records folder {folder}",
                               f"python -m benchmarks.archive DIR... --name {self.records}")
        try:
            table = GENERATORS[self.generator](folder)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # records that lack what the table needs
            raise TestbedError(f"{self.page}:{self.line}: {self.generator} cannot read {folder}: "
                               f"{type(e).__name__}: {e}", "archive the benchmark's own output again") from None
        return f"\n{table}\n{provenance(folder)}\n\n"


def provenance(folder: Path) -> str:
    """The line under a generated table: what it was made from."""
    runs = runs_of(folder)
    results = read_results(folder)
    codes = sorted({str(r.summary.get("code_version")) for r in runs if r.summary.get("code_version")}
                   | {str(x.get("code_version")) for x in results if x.get("code_version")})
    try:
        info = read_json(folder / "archive.json")
    except (OSError, ValueError, InputError):
        info = {}
    info = info if isinstance(info, dict) else {}
    m = info.get("machine")
    machine = describe_machine(m if isinstance(m, dict) else {})
    return (f"Generated by `python -m benchmarks.regenerate` from `docs/results/records/{folder.name}`: "
            + (f"{len(results)} benchmark result{'s' * (len(results) != 1)}" if results and not runs else
               f"{len(runs)} run{'s' * (len(runs) != 1)} ({sum(r.status == 'ok' for r in runs)} ok)")
            + f" of code {', '.join(codes) or '?'}, "
            f"archived {info.get('archived', '?')} by `{info.get('command', '?')}` at {info.get('commit') or '?'}; "
            f"machine: {machine}.")


def pages(docs: Path, records: Path) -> list[Path]:
    return sorted(p for p in docs.rglob("*.md") if records not in p.parents and not p.is_symlink())


FENCE = re.compile(r"^[ \t]*(```|~~~)", re.M)


def _fenced(text: str, at: int) -> bool:
    """Whether ``at`` lies inside a fenced code block (a marker shown as an example there)."""
    return len(FENCE.findall(text, 0, at)) % 2 == 1


def blocks(page: Path, text: str) -> list[Block]:
    return [Block(page, m, text) for m in OPEN.finditer(text) if not _fenced(text, m.start())]


def run(docs: Path, records: Path, check: bool, names: list[str]) -> int:
    """Rewrite (or check) every page's blocks; the exit status. Each records folder is read
    once (``archive.reading_once``), however many blocks use it."""
    with reading_once():
        return _run(docs, records, check, names)


def _run(docs: Path, records: Path, check: bool, names: list[str]) -> int:
    stale = 0
    for page in pages(docs, records):
        text = page.read_text()
        out, last = [], 0
        for b in blocks(page, text):
            if names and b.generator not in names and b.records not in names:
                continue
            new = b.render(records)
            out += [text[last:b.start], new]
            last = b.end
            if new != b.body:
                stale += 1
                print(f"{page}:{b.line}: block `{b.spec}` {'disagrees with' if check else 'rewritten from'} "
                      f"its records", file=sys.stderr if check else sys.stdout)
                if check:
                    diff = list(difflib.unified_diff(b.body.splitlines(), new.splitlines(), "page", "records",
                                                     lineterm="", n=0))
                    print("\n".join(diff[:DIFF_LINES] + ["..."] * (len(diff) > DIFF_LINES)), file=sys.stderr)
        new_text = "".join(out) + text[last:]
        if not check and new_text != text:
            atomic_write(page, new_text)
    if check and stale:
        print(f"{stale} block(s) disagree with their records: run python -m benchmarks.regenerate",
              file=sys.stderr)
    return 1 if check and stale else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help="only the blocks of these generators or records")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 where a page and its records disagree")
    p.add_argument("--docs", type=Path, default=DOCS, help="the pages' folder")
    p.add_argument("--records", type=Path, default=None, help="the records' folder (default DOCS/results/records)")
    args = p.parse_args(argv)
    try:
        return run(args.docs, args.records or args.docs / "results" / "records", args.check, args.names)
    except TestbedError as e:
        print(f"regenerate: {e.message}" + (f" ({e.hint})" if e.hint else ""), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
