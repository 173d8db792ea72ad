"""network.md's operational tables (benchmarks.ops_tables) from constructed benchmark
results with known numbers; the page itself is checked by test_regenerate."""

from __future__ import annotations

import pytest

from benchmarks import archive, ops_tables, regenerate


def _replay_row(links=64, steps=2400, late=0.0028, late_max=0.011, state_max=0.071, **kw):
    row = {"links": links, "steps": steps, "every_s": 0.25, "late_median_s": late, "late_p95_s": 0.0033,
           "late_p99_s": 0.0039, "late_max_s": late_max, "within_target": 0.9996, "apply_median_s": 0.0026,
           "tc_alone_s": 0.0011, "state_median_s": 0.0047, "state_max_s": state_max, "load_start": 0.12,
           "load_end": 1.04,
           "latest": [{"at_s": 1.0, "late_s": 0.011, "woke_s": 0.001, "apply_s": 0.010, "send_s": 0.008,
                       "ack_s": 0.0004},
                      {"at_s": 2.0, "late_s": 0.008, "woke_s": 0.0, "apply_s": 0.008, "send_s": 0.001,
                       "ack_s": 0.0007}]}
    row.update(kw)
    return row


def _archived(tmp_path, benchmark, rows, **extra):
    archive.record(tmp_path / "src", benchmark, rows, **extra)
    return archive.write([tmp_path / "src"], f"{benchmark}-test", records=tmp_path / "records")


def test_replay_latency_table_latest_steps_and_targets(tmp_path):
    argv = ["--steps", "2400", "--every", "0.25", "--links", "64"]
    dest = _archived(tmp_path, "replay_latency", [_replay_row()], target_s=0.02, argv=argv)
    text = ops_tables.replay_latency(dest)
    assert ("| 64 | 2400 (0.25 s) | 1 | 2.8 | 3.3 | 3.9 | 11.0 | 1 | 2.6 | 1.1 | 4.7 | 71.0 | 0.1-1.0 |"
            in text)
    assert ("The 2 latest steps of 64 links (8.0-11.0 ms late) woke 0.0-1.0 ms after their time and spent "
            "8.0-10.0 ms applying (sending 1.0-8.0 ms, the kernel's acknowledgements 0.4-0.7 ms).") in text
    assert "judged on the 10-minute replay of 64 links: a median under 5 ms is met; no step in force later " \
           "than 50 ms is met." in text
    assert "The state file's write took longer than 50 ms at least once." in text
    assert "`python -m benchmarks.replay_latency --steps 2400 --every 0.25 --links 64`" in text
    assert "1 benchmark result of code" in regenerate.provenance(dest)


def test_replay_latency_spread_over_replays_and_missed_targets(tmp_path):
    rows = [_replay_row(late=0.0051, late_max=0.0877, state_max=0.02), _replay_row(late=0.0049)]
    text = ops_tables.replay_latency(_archived(tmp_path, "replay_latency", rows))
    assert "| 64 | 2400 (0.25 s) | 2 | 5.0 [4.9-5.1] | 3.3 [3.3-3.3] |" in text
    assert "judged on the 2 10-minute replays of 64 links: a median under 5 ms is **not** met" in text
    assert "no step in force later than 50 ms is **not** met" in text
    assert "Command: not recorded" in text


def test_replay_latency_short_replays_are_not_judged(tmp_path):
    text = ops_tables.replay_latency(_archived(tmp_path, "replay_latency", [_replay_row(steps=400)]))
    assert "are not judged" in text


def _sample(netns=0, fds=7, **kw):
    return {"netns": netns, "links": 1, "qdiscs": 2, "procs": 0, "fds": fds, **kw}


def test_soak_growth_and_exporter_memory(tmp_path):
    rows = [{"phase": "cycles", "count": 50, "seconds": 40.4, "load_start": 0.5, "load_end": 1.25,
             "samples": [_sample(), _sample()]},
            {"phase": "runs", "count": 10, "seconds": 35.6, "load_start": 1.0, "load_end": 1.0,
             "samples": [_sample(netns=3), _sample(netns=3, fds=9)]},
            {"phase": "scrapes", "count": 500, "seconds": 70.0, "load_start": 1.0, "load_end": 1.0,
             "samples": [_sample(scrapes=10, exporter_rss_kb=56300), _sample(scrapes=500, exporter_rss_kb=72400)]}]
    text = ops_tables.soak(_archived(tmp_path, "soak", rows, argv=["--cycles", "50"]))
    assert ("| 50 up/down cycles of three_switch (with its exporter) | 40 s | 2 samples; none: namespaces 0, "
            "links 0, qdiscs 0, processes 0, fds 0 | - | 0.5-1.2 |") in text
    assert "| 10 short `testbed run`s on one dumbbell | 36 s | 2 samples; fds +2 | - |" in text
    assert "| 500 scrapes of a 256-link exporter | 70 s | 2 samples; none: " in text
    assert "| 56.3 (10), 72.4 (500) |" in text
    assert "`python -m benchmarks.soak --cycles 50`" in text


def test_exporter_seconds_over_scrapes(tmp_path):
    rows = [{"links": 8, "series": 161, "bytes": 20000, "seconds": [0.011, 0.010, 0.012], "load_start": 0.2,
             "load_end": 0.3},
            {"links": 256, "series": 5121, "bytes": 647000, "seconds": [0.29, 0.31, 0.30], "load_start": 0.3,
             "load_end": 0.4}]
    text = ops_tables.exporter(_archived(tmp_path, "exporter", rows))
    assert "| 8 | 3 | 0.011 [0.010-0.012] | 161 | 20000 | 0.2-0.3 |" in text
    assert "| 256 | 3 | 0.300 [0.290-0.310] | 5121 | 647000 | 0.3-0.4 |" in text


@pytest.mark.parametrize("gen", ["replay_latency", "soak", "exporter_scrape", "cross_traffic"])
def test_records_without_the_benchmark_name_the_command(tmp_path, gen):
    with pytest.raises(Exception, match="--record DIR"):
        ops_tables.GENERATORS[gen](tmp_path)


def test_cross_traffic_shares_per_queue_and_the_run(tmp_path):
    rows = [{"kind": "pair", "limit": 1000, "window": "last", "window_s": 9.0, "flows_bps": [10.6e6, 9.4e6],
             "load_start": 0.5, "load_end": 0.6},
            {"kind": "pair", "limit": 1000, "window": "all", "window_s": 18.01, "flows_bps": [9e6, 11e6],
             "load_start": 0.5, "load_end": 0.6},
            {"kind": "run", "width": "1", "iters": 12, "forward_bytes": 4e6, "reverse_bytes": 1.24e6,
             "flow_bytes": 2.64e6, "mean_iter_s": 2.384, "payload_bytes": 2.18e6, "load_start": 0.7,
             "load_end": 0.9}]
    text = ops_tables.cross_traffic(_archived(tmp_path, "cross_traffic", rows, rate="20mbit", seconds=20))
    assert "| 1000 | last 9 s | 10.60 | 9.40 | 0.53 |" in text
    assert "| 1000 | 18 s after 2 s | 9.00 | 11.00 | 0.45 |" in text
    # 2.18 MB * 8 / 20 Mbit/s = 0.872 s
    assert "| allreduce, 2 ranks, 20mbit | 1 | 12 | 2.38 | 2.18 | 0.87 | 0.31 | 0.66 |" in text
    assert "Load (1 min, start-end of the run): 0.7-0.9." in text


def test_recorded_arguments_keep_no_local_path():
    argv = ["--steps", "5", "--record", "/tmp/x/replay", "--log=/tmp/x.jsonl", "--links", "64"]
    assert ops_tables.argv_of(argv) == ["--steps", "5", "--record", "DIR", "--log=FILE", "--links", "64"]
