"""The physical-bound arithmetic that benchmarks/paper_sweep.py reports."""

import pytest

from benchmarks.paper_sweep import bound_check


def test_a_scheme_at_the_needed_time_is_at_exactly_0_9_of_its_bound():
    c, rate, wd, wc = 0.1, 1e9 / 8, 4e6, 1e6
    t_ar = c + wd / rate  # allreduce hides nothing: efficiency 1
    first = bound_check(c, t_ar, 0.2, wd, wc, rate, own_c=c)
    assert first["allreduce_efficiency"] == pytest.approx(1.0)
    at = bound_check(c, t_ar, first["needed_s"], wd, wc, rate, own_c=c)
    assert at["fraction"] == pytest.approx(0.9)
    assert not at["unreachable"]
    assert at["bound"] == pytest.approx((0.1 + 0.032) / (0.1 + 0.008))


def test_unreachable_when_allreduce_hides_more_than_the_scheme_can_gain():
    # measured here (one repeat, 500 Mbit): allreduce 0.130 s against its no-overlap 0.173 s;
    # ternary PacTrain 0.118 s, 0.108 s with the link free
    rate = 500e6 / 8
    b = bound_check(0.105, 0.130, 0.118, 4.24e6, 1.064e6, rate, own_c=0.108)
    assert b["allreduce_efficiency"] == pytest.approx(1.33, abs=0.01)
    assert b["fraction"] == pytest.approx(0.78, abs=0.01)
    assert b["needed_s"] < 0.108 and b["unreachable"]
    plain = bound_check(0.105, 0.130, 0.117, 4.24e6, 2.448e6, rate, own_c=0.105)
    assert plain["needed_s"] == pytest.approx(0.120, abs=0.001) and not plain["unreachable"]
    assert bound_check(0.105, 0.130, 0.117, 4.24e6, 2.448e6, rate)["unreachable"] is False  # no own C: not judged
