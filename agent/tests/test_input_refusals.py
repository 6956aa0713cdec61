"""Inputs the agent refuses outright: a URL that is not http(s), a tls setting it does not know."""

import urllib.error
from pathlib import Path

import pytest

from agent.collectors._common import http_get
from agent.transport.sink import make_sink


def test_http_get_refuses_a_file_url(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not for the scraper")
    with pytest.raises(urllib.error.URLError, match="not an http"):
        http_get(secret.as_uri(), 1.0)


def test_make_sink_refuses_an_unknown_tls_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tls must be 'auto'"):
        make_sink(server="127.0.0.1:1", token="t", spool_dir=str(tmp_path), tls="yes")
