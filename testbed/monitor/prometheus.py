"""`testbed monitor up|down|status`: a real Prometheus scraping testbed's exporters.

Exporters start with what they describe and announce themselves through Prometheus'
file-based service discovery (``testbed.monitor.sd``): `testbed up` starts one link exporter
per testbed (stopped by `testbed down`), `testbed run` serves its run's training metrics
while it runs. Their target files live in ``<state dir>/targets`` (tmpfs, like the
testbeds). So Prometheus, once up, finds every testbed and run started before or after
it, without a restart and without a shared exporter.

Layout of the monitor directory (``--dir``, default ``/var/lib/testbed/monitor``; it
outlives runs and testbeds, so the metric history does too)::

    prometheus.yml       generated; checked with `promtool check config` before start
    rules.yml            recording and alerting rules (testbed.monitor.rules), rewritten by each `up`
    targets/*.json       more file-SD targets, written by hand (e.g. exporters on other hosts)
    data/                Prometheus' TSDB (retention: --retention)
    state.json           pids, addresses and command lines of what `up` started
    prometheus.log, exporter.log

`up` starts Prometheus (the Debian/upstream ``prometheus`` binary) bound to 127.0.0.1
unless told otherwise and, with ``--runs DIR``, an exporter of the run directories under
DIR (for runs started by plain torchrun). Each process is recorded in state.json before it
starts and carries an argument naming this directory's files; `down` stops exactly those.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import yaml

from testbed.common.outdir import OutDir
from testbed.common import procs, rootless
from testbed.monitor import auth, rules, sd
from testbed.common.files import read_json, tail_text, write_json
from testbed.monitor.sd import hostport, read_target, targets_dir, watchers_dir
from testbed.common.errors import StateError, TestbedError

ROOT_DIR = Path("/var/lib/testbed/monitor")


def default_dir() -> Path:
    """``$TESTBED_MONITOR_DIR``; else root's /var/lib/testbed/monitor, or for an ordinary user
    (rootless) ``$XDG_STATE_HOME/testbed/monitor`` (``~/.local/state/testbed/monitor``): it
    must outlive the holder, so it is not on the holder's tmpfs."""
    if os.environ.get("TESTBED_MONITOR_DIR"):
        return Path(os.environ["TESTBED_MONITOR_DIR"])
    if not rootless.active():
        return ROOT_DIR
    xdg = os.environ.get("XDG_STATE_HOME", "")
    state = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return state / "testbed" / "monitor"
JOB = "testbed"
GRAFANA_HINT = ("export GRAFANA_ADMIN_PASSWORD=$(openssl rand -hex 16)  (required: no default admin password); "
                "docker compose -f compose/docker-compose.yml up -d grafana; then http://127.0.0.1:3000 "
                "(log in as admin with that password)")


def _alive(pid: int | None, marker: str) -> bool:
    if not pid:
        return False
    return marker in procs.argv_of(pid)


def _markers(d: Path) -> dict[str, str]:
    return {"prometheus": f"--config.file={d / 'prometheus.yml'}", "exporter": f"--sd-file={d / 'targets' / 'runs.json'}"}


def config(scrape_interval: str, target_dirs: list[Path], rule_files: Sequence[Path] = (),
           token_file: Path | None = None) -> dict:
    """prometheus.yml; ``token_file``: the exporters are an ordinary user's and ask for it."""
    job: dict[str, object] = {
        "job_name": JOB,
        "file_sd_configs": [{"files": [str(t / "*.json") for t in target_dirs], "refresh_interval": "5s"}]}
    if token_file is not None:
        job["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(r) for r in rule_files],
        "scrape_configs": [job],
    }


def _get(url: str, timeout: float):
    """GET from the user's Prometheus, with the user's credentials (testbed.monitor.auth)."""
    return urllib.request.urlopen(urllib.request.Request(url, headers=auth.headers()), timeout=timeout)


def read_state(d: Path) -> dict | None:
    try:
        return read_json(d / "state.json", "state", "monitor state")
    except (OSError, ValueError, TestbedError):
        return None


def _write_state(d: Path, st: dict) -> None:
    write_json(d / "state.json", st)


def up(d: Path, listen: str = "127.0.0.1:9090", runs: list[Path] | None = None,
       exporter_listen: str = "127.0.0.1:0", scrape_interval: str = "2s", retention: str = "15d",
       say=lambda m: None) -> dict:
    prom = shutil.which("prometheus")
    if prom is None:
        raise TestbedError("no prometheus binary on PATH",
                           "install Debian's package (apt-get install prometheus), or start Prometheus and "
                           "Grafana in Docker: `export GRAFANA_ADMIN_PASSWORD=$(openssl rand -hex 16)` (required), "
                           "then `docker compose -f compose/docker-compose.yml --profile prometheus up -d`")
    d = d.resolve()
    marks = _markers(d)
    running = [p for m in marks.values() for p in procs.with_arg(m)]
    if running:
        st = read_state(d) or {}
        raise StateError(f"the monitor in {d} is already running ({st.get('prometheus_url', f'pid {running[0]}')})",
                         "`testbed monitor down` stops it")
    # a real port: it goes into the URLs printed and waited on
    phost, pport = sd.check_listen(listen, "--listen", "127.0.0.1:9090", any_port=False)
    if runs:
        sd.check_listen(exporter_listen, "--exporter-listen", "127.0.0.1:0 (port 0: any free port)")
    sd_dirs = [targets_dir(), d / "targets"]
    try:
        with OutDir(d, "--dir") as md:  # the user's own and private: its TSDB holds their runs' metrics
            os.fchmod(md.fd, 0o700)  # one made before monitor directories were private, too
        for t in sd_dirs:
            t.mkdir(mode=0o700, parents=True, exist_ok=True)
        (d / "data").mkdir(mode=0o700, exist_ok=True)
    except PermissionError:
        raise TestbedError(f"cannot write {d} or {sd_dirs[0]}", "run as root, or choose a directory with --dir") from None
    cfg = d / "prometheus.yml"
    rules_file = d / "rules.yml"  # recording and alerting rules (testbed.monitor.rules)
    rules_file.write_text(rules.render())
    private = auth.required()  # an ordinary user's: scrapes and the web API ask for the user's token
    cfg.write_text("# generated by `testbed monitor up`; edits are overwritten\n"
                   + yaml.safe_dump(config(scrape_interval, sd_dirs, [rules_file],
                                           auth.token_path() if private else None), sort_keys=False))
    if private:
        write_json(d / "web.yml", auth.web_config())  # JSON is YAML; a bcrypt hash of the token
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True)
        if r.returncode != 0:
            raise TestbedError(f"promtool rejects the generated {cfg}: {(r.stdout + r.stderr).strip()[-600:]}",
                               "check --scrape-interval (e.g. 2s, 15s)")
    prom_cmd = [prom, marks["prometheus"], f"--storage.tsdb.path={d / 'data'}",
                f"--storage.tsdb.retention.time={retention}", f"--web.listen-address={hostport(phost, pport)}",
                *([f"--web.config.file={d / 'web.yml'}"] if private else [])]
    exp_cmd = None
    if runs:
        exp_cmd = [*procs.python_argv("collectors"), "--listen", exporter_listen, marks["exporter"],
                   "--sd-label", "exporter=runs", *auth.exporter_args()]
        for run in runs:
            exp_cmd += ["--runs", str(Path(run).resolve())]
    st = {"dir": str(d), "prometheus_url": f"http://{hostport(phost, pport)}", "exporter_url": None,
          "targets": [str(t) for t in sd_dirs], "prometheus_cmd": prom_cmd, "exporter_cmd": exp_cmd,
          "runs": [str(Path(r).resolve()) for r in runs or []],
          "prometheus_pid": None, "exporter_pid": None, "started": time.time()}
    _write_state(d, st)  # recorded before anything starts
    started: dict[str, subprocess.Popen] = {}
    try:
        if exp_cmd:
            with open(d / "exporter.log", "ab") as log:
                started["exporter"] = subprocess.Popen(exp_cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                                       start_new_session=True)
            st["exporter_pid"] = started["exporter"].pid
            _write_state(d, st)
        with open(d / "prometheus.log", "ab") as log:
            started["prometheus"] = subprocess.Popen(prom_cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                                     start_new_session=True, cwd=d)
        st["prometheus_pid"] = started["prometheus"].pid
        _write_state(d, st)
        _wait_ready(st, d, started)
        # runs shorter than Prometheus' discovery delay look for this note to wait for a scrape
        note = _watcher_note(d)
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(json.dumps({"pid": st["prometheus_pid"], "marker": marks["prometheus"],
                                    "url": st["prometheus_url"],
                                    "scrape_interval_s": _seconds(scrape_interval)}) + "\n")
    except BaseException:
        down(d)
        raise
    say(f"Prometheus {st['prometheus_url']}  (data in {d / 'data'})")
    return st


def _wait_ready(st: dict, d: Path, started: dict[str, subprocess.Popen], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for what, proc in started.items():
            # poll(), not /proc/PID/cmdline: right after exec the command line reads empty
            # for a moment (a cold binary widens that window), which looked like an exit
            if proc.poll() is not None:
                log = d / f"{what}.log"
                tail = tail_text(log)[-800:]
                raise TestbedError(f"{what} exited at start; the end of {log}:\n{tail}")
        if st["exporter_pid"] and not st["exporter_url"]:
            addr = read_target(d / "targets" / "runs.json")
            if addr:
                st["exporter_url"] = f"http://{addr}/metrics"
                _write_state(d, st)
        try:
            with _get(st["prometheus_url"] + "/-/ready", 2) as r:
                if r.status == 200 and (st["exporter_url"] or not st["exporter_pid"]):
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise TestbedError(f"Prometheus at {st['prometheus_url']} was not ready after {timeout:.0f} s",
                       f"see {d / 'prometheus.log'}")


def down(d: Path) -> list[str]:
    """Stop this directory's Prometheus and exporter (found by the argument naming its files)."""
    d = d.resolve()
    stopped = []
    for what, marker in _markers(d).items():
        for pid in procs.terminate(procs.with_arg(marker), grace=10.0):
            stopped.append(f"{what} (pid {pid})")
    (d / "targets" / "runs.json").unlink(missing_ok=True)
    _watcher_note(d).unlink(missing_ok=True)
    (d / "state.json").unlink(missing_ok=True)
    return stopped


def _watcher_note(d: Path) -> Path:
    import hashlib

    return watchers_dir() / f"{hashlib.sha256(str(d).encode()).hexdigest()[:16]}.json"


def _seconds(interval: str) -> float:
    """Prometheus duration (``2s``, ``1m``, ``1m30s``) in seconds; 5 when unparsable (promtool checked it)."""
    import re

    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", interval)
    return sum(int(n) * units[u] for n, u in parts) or 5.0


def status(d: Path) -> dict:
    d = d.resolve()
    st = read_state(d)
    if st is None:
        return {"running": False, "dir": str(d)}
    marks = _markers(d)
    out = {"running": _alive(st.get("prometheus_pid"), marks["prometheus"]), "dir": str(d),
           "prometheus_url": st["prometheus_url"], "target_dirs": st.get("targets", []),
           "exporter_url": st.get("exporter_url"),
           "exporter_running": _alive(st.get("exporter_pid"), marks["exporter"]), "runs": st.get("runs"),
           "targets": []}
    if out["running"]:
        try:
            with _get(st["prometheus_url"] + "/api/v1/targets", 5) as r:
                data = json.loads(r.read())
            out["targets"] = [{"url": t["scrapeUrl"], "health": t["health"], "last_error": t.get("lastError", ""),
                               "exporter": t.get("labels", {}).get("exporter", "")}
                              for t in data["data"]["activeTargets"]]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass
    return out
