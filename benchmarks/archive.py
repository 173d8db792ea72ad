"""Copy what a results table needs from run and sweep directories into the repository.

    python -m benchmarks.archive DIR... --name NAME [--records docs/results/records] [--machine FILE]

Each DIR is a run directory (``runs/<id>``, with run.json) or a sweep directory (with
sweep.json and its runs one level below); anything else is refused in one line, before
anything is written. ``docs/results/records/NAME/`` then holds, per DIR, a folder of its
name (a sweep's keeps its runs below it), and per run, in miniature:

    run.json       run_id and request only (what ``find_runs`` recognises a run by)
    summary.json   the run's summary on one line, less its run_dir, monitoring endpoints,
                   null values and the proof's per-link rank lists (report reads the bytes)
    rank0.jsonl    rank 0's iteration records, only the fields reports and the benchmarks'
                   analyses read (ITER_KEEP), floats to 6 significant digits but ``time``
    eval.jsonl     the evaluation records (EVAL_KEEP)
    links.jsonl    the bottleneck links' tc-counter samples (LINK_KEEP): per direction the
                   first, the last and those bounding the timed iterations (thin_links)
    sweep.json     a sweep's index

and ``archive.json``: the sources' names, the command, the commit of this checkout and the
machine: this one, or the one the DIRs were measured on (``--machine FILE``, written there by
``python -m benchmarks.machine``). Absolute paths never reach the records: a source's own
path becomes its archived name, any other becomes its last component. Inputs are read as hostile ones are
(testbed.common.files): no link is followed (a DIR, a run folder or a file that is a link
is refused), only regular files of bounded size are read. NAME, when it exists, is replaced
whole: give every DIR of a table in one command. The size of NAME and of all records
is printed, as files and compressed (as git stores them): the budget for every page's
records together is a few MB compressed (docs/results/records/README.md).

Records are read back by :func:`runs_of`, through ``testbed.runs.reports.report.find_runs``, as
``testbed report`` reads run directories.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import json
import os
import re
import shutil
import stat
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

from benchmarks import machine
from benchmarks.paper_scale import timed_window
from testbed.common.errors import TestbedError
from testbed.common.files import LIMITS
from testbed.common.outdir import OutDir
from testbed.runs.reports.report import RunData, find_runs
from testbed.runs.rundir import code_version

RECORDS = Path(__file__).resolve().parents[1] / "docs" / "results" / "records"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
ITER_KEEP = ("iter", "epoch", "time", "iter_s", "compute_s", "comm_s", "overlap_s", "loss", "accuracy",
             "payload_bytes", "buffer_bytes")
EVAL_KEEP = ("iter", "epoch", "time", "train_s", "accuracy", "loss")
LINK_KEEP = ("time", "link", "direction", "bytes", "drops", "rate_bps", "bytes_per_s", "utilisation",
             "link_rate_bps")
SUMMARY_DROP = ("run_dir", "monitoring")
EXACT = ("time",)
"""Record fields kept at full precision (Unix seconds need 16 digits for milliseconds)."""
ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:[^\s/'\":,;()\[\]]+/)+")


class Refused(TestbedError):
    """A DIR that is not a run or a sweep, a link, a file that is no regular one."""


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{name} is a link or no directory: archive never follows links",
                          "give the run or sweep directory itself") from None
        raise Refused(f"{name}: {e.strerror}", "give run or sweep directories") from None


def _read(dir_fd: int, name: str, where: str) -> bytes | None:
    """A regular file of at most LIMITS["records"] bytes in the held directory, not through a
    link; None when it is not there."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "a link: archive never follows links" if e.errno == errno.ELOOP else e.strerror
        raise Refused(f"{where}/{name} is {why}", "archive run directories as testbed wrote them") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > LIMITS["records"]:
            raise Refused(f"{where}/{name} is no regular file of at most {LIMITS['records'] >> 20} MiB",
                          "archive run directories as testbed wrote them")
        return f.read(LIMITS["records"] + 1)[:LIMITS["records"]]


def _json(data: bytes, where: str) -> dict:
    try:
        d = json.loads(data)
    except (ValueError, RecursionError):
        raise Refused(f"{where} is not JSON", "archive run directories as testbed wrote them") from None
    if not isinstance(d, dict):
        raise Refused(f"{where} is not a JSON object", "archive run directories as testbed wrote them")
    return d


def scrub(value, roots: dict[str, str]):
    """``value`` (JSON) with every absolute path made relative: a source's own path its
    archived name, any other path its last component."""
    if isinstance(value, dict):
        return {k: scrub(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, roots) for v in value]
    if isinstance(value, str):
        for root, name in roots.items():
            value = value.replace(root + "/", name + "/").replace(root, name)
        return ABSOLUTE.sub("", value)
    return value


def _round(v):
    return float(f"{v:.6g}") if isinstance(v, float) else v


def _jsonl(data: bytes | None, keep: tuple[str, ...]) -> str:
    """The records' ``keep`` fields that are not null, one compact JSON object a line."""
    out = []
    for line in (data or b"").splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            break  # a line cut short by a crash: what came before
        if isinstance(rec, dict):
            rec = {k: rec[k] if k in EXACT else _round(rec[k]) for k in keep if rec.get(k) is not None}
            out.append(json.dumps(rec, separators=(",", ":")) + "\n")
    return "".join(out)


def _summary(s: dict) -> dict:
    s = {k: v for k, v in s.items() if k not in SUMMARY_DROP and v is not None}
    if isinstance(s.get("proof_links"), dict):
        s["proof_links"] = {k: {f: x for f, x in v.items() if f not in ("from_ranks", "to_ranks")}
                            if isinstance(v, dict) else v for k, v in s["proof_links"].items()}
    return s


def _dump(obj) -> str:
    return json.dumps(obj, indent=1) + "\n"


def read_run(dir_fd: int, where: str, roots: dict[str, str]) -> dict[str, str]:
    """A run's files in miniature: {file name: text}."""
    run = _read(dir_fd, "run.json", where)
    if run is None:
        raise Refused(f"{where} has no run.json", "give run directories or sweep directories")
    r = _json(run, f"{where}/run.json")
    files = {"run.json": _dump(scrub({k: r.get(k) for k in ("run_id", "request")}, roots))}
    summary = _read(dir_fd, "summary.json", where)
    k = 1.0
    if summary is not None:
        s = scrub(_summary(_json(summary, f"{where}/summary.json")), roots)
        files["summary.json"] = json.dumps(s, separators=(",", ":")) + "\n"
        k = s.get("dilation") if isinstance(s.get("dilation"), (int, float)) else 1.0
    for name, keep in (("rank0.jsonl", ITER_KEEP), ("eval.jsonl", EVAL_KEEP), ("links.jsonl", LINK_KEEP)):
        text = _jsonl(_read(dir_fd, name, where), keep)
        if text:
            files[name] = scrub(text, roots) if name == "links.jsonl" else text
    if "links.jsonl" in files:
        files["links.jsonl"] = thin_links(files["links.jsonl"], files.get("rank0.jsonl", ""), k)
    return files


def thin_links(links: str, iters: str, k: float) -> str:
    """Per link direction, the first and last samples and those that bound the timed
    iterations (all but the first; their wall-clock span, iter_s x K before the second
    record's time to the last record's): what the uplink bytes per timed iteration
    (benchmarks.paper_scale.steady_wire) and the whole run's bytes are computed from. The
    other samples, one a second per direction, were nine tenths of a 64-rank table's records."""
    window = timed_window([json.loads(x) for x in iters.splitlines()], k)
    bounds = list(window[:2]) if window else []
    series: dict[tuple, list[tuple[float, str]]] = {}
    for line in links.splitlines():
        rec = json.loads(line)
        if isinstance(rec.get("time"), (int, float)):
            series.setdefault((rec.get("link"), rec.get("direction")), []).append((rec["time"], line))
    kept = set()
    for samples in series.values():
        kept |= {samples[0][1], samples[-1][1]}
        for b in bounds:
            before = [line for t, line in samples if t <= b]
            after = [line for t, line in samples if t >= b]
            kept |= set(before[-1:]) | set(after[:1])
    return "".join(line + "\n" for line in links.splitlines() if line in kept)


def read_source(path: Path) -> dict[str, dict[str, str]]:
    """A run or sweep directory as {folder relative to NAME: {file name: text}}."""
    roots = {str(Path(os.path.abspath(path))): path.name, os.path.realpath(path): path.name}
    fd = _open_dir(path)
    try:
        sweep = _read(fd, "sweep.json", str(path))
        result = _read(fd, RESULT, str(path)) if sweep is None else None
        if result is not None:
            return {path.name: {RESULT: _dump(_result(_json(result, f"{path}/{RESULT}"), f"{path}/{RESULT}"))}}
        if sweep is None:
            if _read(fd, "run.json", str(path)) is None:
                raise Refused(f"{path} is not a run, sweep or benchmark result directory (no run.json, "
                              f"sweep.json or {RESULT})", "give directories made by `testbed run`, `testbed sweep` "
                              "or a benchmark's --record")
            return {path.name: read_run(fd, str(path), roots)}
        out = {path.name: {"sweep.json": _dump(scrub(_json(sweep, f"{path}/sweep.json"), roots))}}
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            if entry.is_symlink():
                raise Refused(f"{path}/{entry.name} is a link: archive never follows links",
                              "archive sweep directories as testbed wrote them")
            if entry.is_dir(follow_symlinks=False):
                rfd = _open_dir(entry.name, fd)
                try:
                    if _read(rfd, "run.json", f"{path}/{entry.name}") is not None:
                        out[f"{path.name}/{entry.name}"] = read_run(rfd, f"{path}/{entry.name}", roots)
                finally:
                    os.close(rfd)
        return out
    finally:
        os.close(fd)


RESULT = "result.json"
"""A benchmark's own result (``--record DIR`` of benchmarks that are not testbed runs): a JSON
object with ``benchmark`` (its module's name), ``code_version`` and ``rows`` (a list of
objects), archived as it is."""


def _result(obj: dict, where: str) -> dict:
    if not isinstance(obj.get("benchmark"), str) or not isinstance(obj.get("rows"), list) \
            or not all(isinstance(r, dict) for r in obj["rows"]):
        raise Refused(f"{where} has no benchmark name or no list of rows", "archive what a benchmark's --record wrote")
    return obj


def record(where: Path, benchmark: str, rows: list[dict], **extra) -> Path:
    """A benchmark's ``--record DIR``: DIR/result.json (DIR made, private to its user, never
    through a link), which ``python -m benchmarks.archive DIR --name NAME`` archives."""
    with OutDir(where, "--record") as d:
        d.write_text(RESULT, _dump({"benchmark": benchmark, "code_version": code_version(), **extra, "rows": rows}))
    return where / RESULT


def read_results(folder: Path) -> list[dict]:
    """Every benchmark result in ``folder`` (records/NAME or a --record DIR's parent): its
    folders' ``result.json``, read as archive reads its sources (no link followed, bounded,
    a JSON object with a benchmark name and rows, or a one-line refusal). Within
    :func:`reading_once`, each folder once."""
    return _once(("results", folder), lambda: _read_results(folder))


def _read_results(folder: Path) -> list[dict]:
    out = []
    fd = _open_dir(folder)
    try:
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                continue
            sub = _open_dir(entry.name, fd)
            try:
                data = _read(sub, RESULT, f"{folder}/{entry.name}")
            finally:
                os.close(sub)
            if data is not None:
                where = f"{folder}/{entry.name}/{RESULT}"
                out.append(_result(_json(data, where), where))
    finally:
        os.close(fd)
    return out


def results_of(folder: Path, benchmark: str) -> list[dict]:
    """The archived results of ``benchmark`` in ``folder`` (records/NAME), each as written."""
    out = [r for r in read_results(folder) if r.get("benchmark") == benchmark]
    if not out:
        raise TestbedError(f"{folder}: no {benchmark} result", f"python -m benchmarks.{benchmark} --record DIR, "
                           "then python -m benchmarks.archive DIR --name NAME")
    return out


def size(path: Path) -> str:
    """The files' bytes under ``path``, and compressed as git stores them (zlib, each file)."""
    files = [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    raw, packed = sum(p.lstat().st_size for p in files), sum(len(zlib.compress(p.read_bytes())) for p in files)
    return f"{raw / 1e6:.2f} MB ({packed / 1e6:.2f} MB compressed)"


def write(sources: list[Path], name: str, records: Path = RECORDS, where: dict | None = None,
          machine_file: str = "machine.json") -> Path:
    """Archive ``sources`` into ``records/name``; the folder. ``where``: the machine they were
    measured on (:mod:`benchmarks.machine`), this one by default."""
    if not NAME.match(name):
        raise Refused(f"--name {name!r} is not a plain folder name", "letters, digits, '.', '_' and '-'")
    folders: dict[str, dict[str, str]] = {}
    for src in sources:  # everything is read (and refused) before anything is written
        if any(f.split("/")[0] == src.name for f in folders):
            raise Refused(f"two DIRs are named {src.name}", "archive them under two names")
        folders.update(read_source(src))
    dest = records / name
    with OutDir(records, "--records", mode=0o755):
        pass
    if dest.is_symlink():
        raise Refused(f"{dest} is a link", "remove it: records folders are plain folders")
    if dest.is_dir():
        shutil.rmtree(dest)  # the folder is exactly what was archived now
    for folder, files in sorted(folders.items()):
        with OutDir(dest / folder, "--records", mode=0o755) as d:
            for fname, text in files.items():
                d.write_text(fname, text)
    runs = sum(1 for files in folders.values() if "run.json" in files)
    info = {"name": name, "sources": sorted({f.split("/")[0] for f in folders}), "runs": runs,
            "command": f"python -m benchmarks.archive {' '.join(s.name for s in sources)} --name {name}"
                       + (f" --machine {machine_file}" if where else ""),
            "archived": datetime.date.today().isoformat(), "commit": code_version(), "machine": where or machine.describe()}
    with OutDir(dest, "--records", mode=0o755) as d:
        d.write_text("archive.json", _dump(info))
    return dest


_READ: dict[tuple[str, Path], list] | None = None
"""Inside :func:`reading_once`: each folder's runs and results, read at most once."""


@contextlib.contextmanager
def reading_once():
    """Within: :func:`runs_of` and :func:`read_results` read each folder once
    (``benchmarks.regenerate``'s pass over the pages, whose blocks and provenance lines read
    the same folders again and again)."""
    global _READ
    before, _READ = _READ, {}
    try:
        yield
    finally:
        _READ = before


def runs_of(folder: Path) -> list[RunData]:
    """The runs archived in ``folder`` (records/NAME), read as ``testbed report`` reads them."""
    if not folder.is_dir():
        raise TestbedError(f"{folder}: no such records folder", "archive it: python -m benchmarks.archive")
    return _once(("runs", folder), lambda: _runs_in(folder))


def _runs_in(folder: Path) -> list[RunData]:
    dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and not os.path.lexists(p / RESULT))
    return find_runs(dirs) if dirs else []


def _once(key: tuple[str, Path], read: Callable[[], list]) -> list:
    """``read()``, kept under ``key`` within :func:`reading_once`."""
    if _READ is None:
        return read()
    if key not in _READ:
        _READ[key] = read()
    return _READ[key]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                   help="run or sweep directories, or a benchmark's --record directory")
    p.add_argument("--name", required=True, help="the records folder's name, e.g. strong-scaling-2026-11-27")
    p.add_argument("--records", type=Path, default=RECORDS, help="where records folders live")
    p.add_argument("--machine", type=Path, metavar="FILE",
                   help="the machine the DIRs were measured on: what `python -m benchmarks.machine` printed there "
                        "(default: this machine)")
    args = p.parse_args(argv)
    try:
        where = machine.load(args.machine) if args.machine else None
        dest = write(args.dirs, args.name, args.records, where, args.machine.name if args.machine else "")
    except TestbedError as e:
        print(f"archive: {e.message}" + (f" ({e.hint})" if e.hint else ""), file=sys.stderr)
        return 1
    runs = len(runs_of(dest))
    results = len(read_results(dest))
    what = f"{results} benchmark result{'s' * (results != 1)}" if results and not runs else \
        f"{runs} run{'s' * (runs != 1)}"
    print(f"{dest}: {what}, {size(dest)}; all records: {size(args.records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
