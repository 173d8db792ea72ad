"""The runs a report reads: run directories (runs/<id>) or directories holding them (a
sweep's), each as its summary.json (or, for a run that never finished, what run.json says),
its evaluations and its link samples. Torn files are skipped with a warning."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import InputError, read_json, read_jsonl


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
        if name == "topk" and s.get("topk_ratio") is not None:
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


def _json_file(path: Path, warn) -> dict | None:
    """A run's JSON file, or None (with a warning) when it is torn or not a JSON object."""
    try:
        d = read_json(path, "json", path.name)
    except FileNotFoundError:
        return {}
    except InputError as e:
        warn(f"skipped {path.parent}: {e.message}")
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
            summary = _json_file(c / "summary.json", warn)
            if summary is None:
                continue
            if not summary:
                run = _json_file(c / "run.json", warn)
                try:
                    summary = {"run_id": run["run_id"], "status": "incomplete", "scheme": run["request"]["scheme"],
                               "bw": run["request"]["bw"]}
                except (TypeError, KeyError):
                    if run is not None:
                        warn(f"skipped {c}: run.json lacks run_id/request")
                    continue
            runs.append(RunData(c, summary, read_jsonl(c / "eval.jsonl"), read_jsonl(c / "links.jsonl")))
    return runs
