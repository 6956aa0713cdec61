"""Agent config: the example file, env overrides, and errors that name the bad key/value."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig, ConfigError, load_config, parse_config, schema

EXAMPLE = Path(__file__).resolve().parents[2] / "packaging" / "proof-agent.toml"


def test_example_file_lists_every_option_with_its_default() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    for section, keys in schema().items():
        assert section in data, f"[{section}] missing from {EXAMPLE.name}"
        for key, (_typ, default, _doc) in keys.items():
            assert key in data[section], f"[{section}] {key} missing from {EXAMPLE.name}"
            if (section, key) != ("server", "token_file"):  # example suggests a path
                assert data[section][key] == default, (section, key)
    cfg = load_config(EXAMPLE, env={})
    assert cfg.dcgm.mode == "bindings" and cfg.spool.max_mib == 2048
    assert cfg.source == str(EXAMPLE)


def test_env_overrides_win_and_are_typed(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('[server]\naddress = "ingest:443"\n[logs]\nglobs = ["/a/*.log"]\n')
    cfg = load_config(
        path,
        env={
            "PROOF_AGENT_SERVER_TOKEN": "tok-1",
            "PROOF_AGENT_SERVER_TLS": "false",
            "PROOF_AGENT_SPOOL_MAX_MIB": "64",
            "PROOF_AGENT_AGENT_INTERVAL_S": "0.5",
            "PROOF_AGENT_LOGS_GLOBS": "/x/*.out, /y/*.err",
            "PROOF_AGENT_DCGM_MODE": "off",
            "UNRELATED": "1",
        },
    )
    assert cfg.server.address == "ingest:443"
    assert cfg.server.token == "tok-1" and cfg.server.tls is False
    assert cfg.spool.max_mib == 64 and cfg.agent.interval_s == 0.5
    assert cfg.logs.globs == ["/x/*.out", "/y/*.err"]
    assert cfg.dcgm.mode == "off"
    assert cfg.resolved_token() == "tok-1"


def test_token_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("secret-token\n")
    cfg = parse_config({"server": {"token_file": str(tmp_path / "token")}}, env={})
    assert cfg.resolved_token() == "secret-token"
    bad = parse_config({"server": {"token_file": str(tmp_path / "missing")}}, env={})
    with pytest.raises(ConfigError, match=r"token_file .*missing.* cannot be read"):
        bad.resolved_token()


@pytest.mark.parametrize(
    ("data", "env", "message"),
    [
        (
            {"server": {"adress": "x:1"}},
            {},
            r"unknown key \[server\] adress \(did you mean 'address'\?\)",
        ),
        ({"servr": {}}, {}, r"unknown section \[servr\] \(did you mean 'server'\?\)"),
        ({"spool": {"max_mib": "lots"}}, {}, r"\[spool\] max_mib must be an integer, got 'lots'"),
        ({"server": {"tls": "yes"}}, {}, r"\[server\] tls must be true or false, got 'yes'"),
        (
            {"dcgm": {"mode": "magic"}},
            {},
            r"\[dcgm\] mode must be one of bindings, exporter, off, got 'magic'",
        ),
        ({"agent": {"interval_s": 0}}, {}, r"\[agent\] interval_s must be > 0"),
        ({"server": {"address": "nohostport"}}, {}, r"address must be host:port"),
        ({"logs": {"globs": "/a"}}, {}, r"\[logs\] globs must be a list of strings"),
        (
            {},
            {"PROOF_AGENT_SPOOL_MAX_MIB": "x"},
            r"environment PROOF_AGENT_SPOOL_MAX_MIB must be an integer",
        ),
        (
            {},
            {"PROOF_AGENT_SERVER_TOKN": "x"},
            r"environment PROOF_AGENT_SERVER_TOKN: no such option",
        ),
        ({"server": {"cert_file": "/c"}}, {}, r"cert_file and key_file must be set together"),
    ],
)
def test_errors_name_key_and_value(data: dict[str, Any], env: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, source="t.toml", env=env)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\naddress=1")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML"):
        load_config(bad, env={})
    # no file given and the default path missing → defaults, not an error
    cfg = load_config(None, env={"PROOF_AGENT_CONFIG": ""})
    assert isinstance(cfg, AgentConfig)
