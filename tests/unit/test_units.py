import pytest

from testbed.model.units import Duration, Loss, Rate, UnitError


@pytest.mark.parametrize("text,bps", [("100mbit", 10**8), ("1gbit", 10**9), ("1.5gbit", 15 * 10**8),
                                      ("500kbit", 5 * 10**5), ("10GBit", 10**10), ("8kbit", 8000)])
def test_rate_parse(text, bps):
    r = Rate.parse(text)
    assert r.bps == bps
    assert Rate.parse(str(r)) == r
    assert r.bytes_per_second == bps // 8


@pytest.mark.parametrize("text", ["100mbps", "100Mbps", "1MBps", "100", "100 m", "fast", "", "-1mbit", "1kbit", "1000tbit"])
def test_rate_rejects(text):
    with pytest.raises(UnitError):
        Rate.parse(text)


def test_rate_mbps_hint_says_bits():
    with pytest.raises(UnitError, match="megabytes"):
        Rate.parse("100mbps")


def test_rate_rejects_bare_numbers():
    with pytest.raises(UnitError, match="no unit"):
        Rate.parse(100)


@pytest.mark.parametrize("text,us", [("5ms", 5000), ("250us", 250), ("1s", 10**6), ("0.5ms", 500), ("0", 0)])
def test_duration(text, us):
    assert Duration.parse(text).us == us
    assert Duration.parse(str(Duration.parse(text))).us == us


@pytest.mark.parametrize("text", ["5", "5 min", "ms", "61s", 5])
def test_duration_rejects(text):
    with pytest.raises(UnitError):
        Duration.parse(text)


def test_loss():
    assert Loss.parse("0.1%").fraction == pytest.approx(0.001)
    assert str(Loss.parse("2%")) == "2%"
    for bad in ["0.1", 0.1, "101%", "x%"]:
        with pytest.raises(UnitError):
            Loss.parse(bad)
