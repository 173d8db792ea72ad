"""An ordinary user's metrics answer only their token (testbed.monitor.auth, collectors.serve);
tests/kernel/test_shared_machine.py asks another real user's exporter and Prometheus."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, Gauge

from collectors.serve import serve
from testbed.common.errors import StateError
from testbed.monitor import auth
from testbed.monitor.prometheus import config


def _status(url: str, headers: dict) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_guarded_exporter_answers_its_token_only():
    reg = CollectorRegistry(auto_describe=False)
    Gauge("testbed_x", "x", registry=reg).set(1)
    srv, _ = serve(reg, "127.0.0.1", 0, "s3cret-token-of-enough-length")
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"},
                        {"Authorization": "Bearer s3cret-token-of-enough-lengt"}):
            code, body = _status(url, headers)
            assert code == 401 and b"testbed_x" not in body, headers
        code, body = _status(url, {"Authorization": "Bearer s3cret-token-of-enough-length"})
        assert code == 200 and b"testbed_x 1.0" in body
    finally:
        srv.server_close()


def test_the_token_is_made_private_once_and_a_token_file_others_can_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, str(tmp_path / "st" / "metrics.token"))
    first = auth.token()
    assert auth.token() == first and len(first) >= 32
    assert oct(os.stat(tmp_path / "st" / "metrics.token").st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "st").st_mode & 0o777) == "0o700"
    os.chmod(tmp_path / "st" / "metrics.token", 0o644)
    with pytest.raises(StateError, match="not a private file of yours"):
        auth.token()
    (tmp_path / "st" / "metrics.token").unlink()
    (tmp_path / "st" / "metrics.token").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateError, match="not a private file of yours"):
        auth.token()


def test_prometheus_scrapes_with_the_token_file_and_asks_for_it_as_a_password(tmp_path, monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, str(tmp_path / "metrics.token"))
    job = config("2s", [tmp_path / "targets"], [], auth.token_path())["scrape_configs"][0]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": str(tmp_path / "metrics.token")}
    assert "authorization" not in config("2s", [tmp_path / "targets"])["scrape_configs"][0]  # root's, as before
    hashed = auth.web_config()["basic_auth_users"][auth.USER]
    assert bcrypt.checkpw(auth.token().encode(), hashed.encode())
