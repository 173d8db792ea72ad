"""The runs a report reads: run directories (runs/<id>) or directories holding them (a
sweep's), each as its summary.json (or, for a run that never finished, what run.json says),
its evaluations and its link samples. Torn files are skipped with a warning."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import InputError, read_json, read_jsonl
from testbed.runs.userrecords import sane_number


@dataclass
class RunData:
    path: Path
    summary: dict
    evals: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.summary.get("status", "unknown")

    @property
    def bw(self) -> str:
        return str(self.summary.get("bw") or "as configured")

    @property
    def label(self) -> str:
        s = self.summary
        name = s.get("scheme", "?")
        if name in ("topk", "gtopk") and s.get("topk_ratio") is not None:
            name += f" {s['topk_ratio']:g}"
        if name == "spardl" and s.get("spardl_density") is not None:
            name += f" {s['spardl_density']:g}"
        if name == "prunex" and s.get("prunex_sparsity") is not None:
            name += f" {s['prunex_sparsity']:g}"
        if name == "hook" and isinstance(s.get("hook"), str):
            name += f" {s['hook']}"
        if name == "pactrain":
            if s.get("prune_ratio") is not None:
                name += f" {s['prune_ratio']:g}"
            if isinstance(s.get("ternary"), bool):  # (the summaries of every version say which)
                name += " ternary" if s["ternary"] else " exact"
        return name

    def tta(self, target: float | None) -> float | None:
        """Training seconds to ``target`` (from the evaluation records), else the run's own."""
        if target is None:
            return self.summary.get("time_to_target_s")
        for e in self.evals:
            if e["accuracy"] >= target:
                return e["train_s"]
        return None

    def tta_sustained(self, target: float | None) -> float | None:
        """Training seconds to ``target`` held for K_SUSTAINED evaluations in a row (the
        summary's target when None)."""
        from testbed.runs.reports.stats import sustained_tta

        t = target if target is not None else self.summary.get("target_accuracy")
        return sustained_tta(self.evals, t) if isinstance(t, (int, float)) else None


def _json_file(path: Path, warn) -> dict | None:
    """A run's JSON file, or None (with a warning) when it is torn or not a JSON object."""
    try:
        d = read_json(path, "json", path.name)
    except FileNotFoundError:
        return {}
    except InputError as e:
        warn(f"skipped {path.parent}: {e.message}")
        return None
    except RecursionError:
        warn(f"skipped {path.parent}: {path} is nested deeper than JSON's parser goes (not a testbed file)")
        return None
    except (OSError, ValueError) as e:
        warn(f"skipped {path.parent}: {path.name} is unreadable or torn ({e})")
        return None
    if not isinstance(d, dict):
        warn(f"skipped {path.parent}: {path.name} is not a JSON object")
        return None
    return d


def find_runs(dirs: list[Path], warn=lambda m: None) -> list[RunData]:
    runs = []
    for d in dirs:
        if not d.is_dir():
            raise TestbedError(f"{d}: no such directory", "give run directories (runs/<id>) or a sweep directory")
        candidates = [d] if (d / "run.json").exists() else sorted(p.parent for p in d.glob("*/run.json"))
        if not candidates:
            raise TestbedError(f"{d}: no runs found (no run.json here or one level below)",
                               "give run directories made by `testbed run` or `testbed sweep`")
        for c in candidates:
            run = _one_run(c, warn)
            if run is not None:
                runs.append(run)
    return runs


def _one_run(c: Path, warn) -> RunData | None:
    """The run in ``c``, or None with one warning naming the file that made it unreadable
    (torn, oversized, too deeply nested, of the wrong shape: a run directory is untrusted)."""
    summary = _json_file(c / "summary.json", warn)
    if summary is None:
        return None
    if not summary:
        run = _json_file(c / "run.json", warn)
        if run is None:
            return None  # _json_file warned
        try:
            summary = {"run_id": run["run_id"], "status": "incomplete", "scheme": run["request"]["scheme"],
                       "bw": run["request"]["bw"]}
        except (TypeError, KeyError):
            warn(f"skipped {c}: run.json lacks run_id/request")
            return None
    dropped = _typed(summary)
    if dropped:
        warn(f"{c}: summary.json's {', '.join(dropped[:10])} had the wrong type and were left out")
    records = {}
    for name in ("eval.jsonl", "links.jsonl"):
        try:
            records[name] = read_jsonl(c / name)
        except InputError as e:
            warn(f"skipped {c}: {e.message}")
            return None
        except OSError as e:
            warn(f"skipped {c}: {c / name} is unreadable ({os.strerror(e.errno or 0)})")
            return None
    return RunData(c, summary, _numeric(records["eval.jsonl"], EVAL_FIELDS),
                   _numeric(records["links.jsonl"], LINK_FIELDS, ("link", "direction")))


_NUMBER = (int, float)
SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    **{k: (str,) for k in ("scheme", "variant", "status", "bw", "run_id", "hook", "model", "dataset", "proof")},
    **{k: _NUMBER for k in ("topk_ratio", "spardl_density", "prunex_sparsity", "prune_ratio", "time_to_target_s",
                            "target_accuracy", "final_accuracy", "final_loss", "mean_iter_s", "median_iter_s",
                            "mean_payload_bytes", "final_payload_bytes", "train_s", "wall_s", "world_size",
                            "iterations", "seed", "epochs", "mean_wire_tx_bytes_per_iteration")},
    "ternary": (bool,), "hyper": (dict,), "params": (dict,), "bottleneck": (dict,), "records": (dict,),
    "proof_links": (dict,), "proof_gradients": (dict,),
}
"""The summary keys reports read, with their types: summary.json is untrusted input (a run
directory can come from anywhere), so a value of another type is left out, not crashed on."""
BOTTLENECK_TYPES = {"bytes": _NUMBER, "bytes_per_iteration": _NUMBER, "max_utilisation": _NUMBER,
                    "mean_utilisation": _NUMBER, "links": (dict,)}
EVAL_FIELDS = ("accuracy", "train_s")
LINK_FIELDS = ("time", "utilisation", "bytes_per_s", "rate_bps")


def _typed(summary: dict, types: dict | None = None) -> list[str]:
    """Remove the keys of ``summary`` whose value has the wrong type (numbers must be finite
    and not bools); the keys removed."""
    types = SUMMARY_TYPES if types is None else types
    bad = [k for k, kinds in types.items() if k in summary and summary[k] is not None
           and not _is_a(summary[k], kinds)]
    for k in bad:
        del summary[k]
    if types is SUMMARY_TYPES:
        if isinstance(summary.get("bottleneck"), dict):
            bad += [f"bottleneck.{k}" for k in _typed(summary["bottleneck"], BOTTLENECK_TYPES)]
        for key in ("hyper", "params"):  # runs are grouped by these: plain values only
            group = summary.get(key)
            if isinstance(group, dict):
                odd = [k for k, v in group.items() if not (v is None or isinstance(v, (str, int, float, bool)))]
                for k in odd:
                    del group[k]
                bad += [f"{key}.{k}" for k in odd]
    return bad


def _is_a(v: object, kinds: tuple[type, ...]) -> bool:
    if kinds is _NUMBER:
        return isinstance(v, _NUMBER) and not isinstance(v, bool) and sane_number(v, math.inf)
    return isinstance(v, kinds)


def _numeric(records: list[dict], numbers: tuple[str, ...], strings: tuple[str, ...] = ()) -> list[dict]:
    """The records whose ``numbers`` fields are finite numbers and ``strings`` fields strings."""
    return [r for r in records if all(_is_a(r.get(k), _NUMBER) for k in numbers)
            and all(isinstance(r.get(k), str) for k in strings)]
