import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.parsers.prometheus import ParseCache, parse_text

DATA = Path(__file__).parent / "data"
PROM_FILES = sorted(DATA.glob("*/*.prom"))


def test_all_prom_fixtures_are_found() -> None:
    assert len(PROM_FILES) == 4


@pytest.mark.parametrize("path", PROM_FILES, ids=lambda p: p.name)
def test_fixture_parses_cleanly_and_matches_prometheus_client(path: Path) -> None:
    text = path.read_text()
    ours = parse_text(text)
    assert ours.errors == []
    reference = [
        (s.name, s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]
    mine = [(s.name, s.labels, s.value) for s in ours.samples]
    assert len(mine) == len(reference)
    for a, b in zip(mine, reference, strict=True):
        # prometheus_client appends `_total` to counters exposed without it; we keep the
        # name exactly as exposed (that is the name the exporter documents).
        assert a[0] == b[0] or a[0] + "_total" == b[0]
        assert a[1] == b[1]
        assert a[2] == b[2] or (math.isnan(a[2]) and math.isnan(b[2]))


def test_l40s_scrape_values_and_types() -> None:
    scrape = parse_text((DATA / "dcgm/dcgm_exporter_metrics_L40S_upcloud.prom").read_text())
    by_name = {s.name: s for s in scrape.samples}
    assert by_name["DCGM_FI_DEV_POWER_USAGE"].value == pytest.approx(35.686)
    assert by_name["DCGM_FI_DEV_SM_CLOCK"].labels["UUID"] == (
        "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
    )
    assert by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].value == 5551899580
    assert scrape.types["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
    assert scrape.help["DCGM_FI_DEV_SM_CLOCK"] == "SM clock frequency (in MHz)."


def test_vllm_histogram_family_resolution() -> None:
    scrape = parse_text((DATA / "vllm/vllm_metrics_datadog_fixture.prom").read_text())
    assert scrape.type_of("vllm:e2e_request_latency_seconds_bucket") == "histogram"
    assert scrape.type_of("vllm:e2e_request_latency_seconds_sum") == "histogram"
    assert scrape.family_of("vllm:prompt_tokens_total") == "vllm:prompt_tokens_total"
    buckets = [
        s
        for s in scrape.samples
        if s.name == "vllm:time_to_first_token_seconds_bucket" and s.labels["le"] == "+Inf"
    ]
    assert len(buckets) == 1 and buckets[0].value == 1.0
    assert math.isinf(float(buckets[0].labels["le"]))


def test_escapes_special_values_timestamps_and_exemplars() -> None:
    text = (
        "# HELP m A help with a \\\\ backslash and\\nnewline\n"
        "# TYPE m gauge\n"
        'm{path="C:\\\\x",msg="say \\"hi\\"\\nbye",brace="}"} NaN 1700000000123\n'
        "up +Inf\n"
        "down -Inf\n"
        'rpc_seconds_bucket{le="0.5"} 7 # {trace_id="abc"} 0.3 1700000000.1\n'
        'rpc_seconds{quantile="0.99"} 1.5e-3\n'
        "  \n"
        "this is not a sample\n"
        'broken{a="1" 3\n'
        "last 2\n"
    )
    s = parse_text(text)
    m = s.samples[0]
    assert m.labels == {"path": "C:\\x", "msg": 'say "hi"\nbye', "brace": "}"}
    assert math.isnan(m.value) and m.timestamp_ms == 1700000000123
    assert s.help["m"] == "A help with a \\ backslash and\nnewline"
    assert s.samples[1].value == math.inf and s.samples[2].value == -math.inf
    assert s.samples[3].value == 7 and s.samples[3].timestamp_ms is None
    assert s.samples[4].labels == {"quantile": "0.99"} and s.samples[4].value == 0.0015
    assert s.samples[-1].name == "last" and s.samples[-1].value == 2
    assert len(s.errors) == 2
    assert s.errors[0].startswith("line 9:") and s.errors[1].startswith("line 10:")


@pytest.mark.parametrize("path", PROM_FILES, ids=lambda p: p.name)
def test_parse_cache_gives_identical_results_across_scrapes(path: Path) -> None:
    text = path.read_text()
    cache = ParseCache()
    plain = parse_text(text).samples
    first = parse_text(text, cache).samples
    second = parse_text(text, cache).samples
    assert first == plain and second == plain
    assert cache.labels  # the second scrape was served from the cache
    labelled = [i for i, s in enumerate(second) if s.labels]
    assert all(second[i].labels is first[i].labels for i in labelled)


def test_parse_cache_with_brace_and_escapes_in_values() -> None:
    cache = ParseCache()
    text = 'm{a="x}y",b="1"} 1\nm{a="x}y",b="2"} 2\nm{p="q\\"r"} 3\n'
    for _ in range(2):
        s = parse_text(text, cache)
        assert [x.labels for x in s.samples] == [
            {"a": "x}y", "b": "1"},
            {"a": "x}y", "b": "2"},
            {"p": 'q"r'},
        ]
