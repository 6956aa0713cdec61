"""contract/limits.py: the one set of limits, and the pure cleaning and checking functions."""

from __future__ import annotations

import json

from contract import limits as L


def test_decode_output_replaces_nul_and_invalid_utf8() -> None:
    assert L.decode_output(b"\x00\x00 corrupted") == "\ufffd\ufffd corrupted"
    assert L.decode_output(b"ok \xff\xfe!") == "ok \ufffd\ufffd!"
    assert L.decode_output(b"plain") == "plain"


def test_clean_line_keeps_the_last_redraw_of_a_long_progress_bar() -> None:
    bar = "\r".join(f"{i:5d}/9999 [{'#' * 20}]" for i in range(2000)) + " done"
    assert len(bar) > L.MAX_LOG_LINE_CHARS
    assert L.clean_line(bar) == " 1999/9999 [####################] done"
    # Under the limit a line with \r is left alone: the parser sees it as it came.
    assert L.clean_line("a\rb") == "a\rb"


def test_clean_line_truncates_with_a_marker_exactly_at_the_limit() -> None:
    line = "A" * 26_498
    out = L.clean_line(line)
    assert len(out) == L.MAX_LOG_LINE_CHARS
    kept = out.index("…")
    assert out == "A" * kept + f"…[truncated {26_498 - kept} chars]"
    for n in (L.MAX_LOG_LINE_CHARS + 1, 10**6):
        assert len(L.clean_line("x" * n)) == L.MAX_LOG_LINE_CHARS


def test_clean_identifier_keeps_long_ids_distinct() -> None:
    a = L.clean_identifier("GPU-" + "a" * 196, L.MAX_GPU_CHARS)
    b = L.clean_identifier("GPU-" + "a" * 195 + "b", L.MAX_GPU_CHARS)
    assert len(a) == len(b) == L.MAX_GPU_CHARS and a != b and "…#" in a
    assert L.clean_identifier("GPU-1", L.MAX_GPU_CHARS) == "GPU-1"
    assert L.clean_identifier("node\x00a", 255) == "node\ufffda"
    # The same value always cleans to the same id (agent and ingest agree on Register).
    assert L.clean_identifier("n" * 300, 255) == L.clean_identifier("n" * 300, 255)


def test_lone_surrogates_are_replaced() -> None:
    bad = "file-\udcff.log"  # a path decoded with surrogateescape
    assert L.clean_text(bad, 100) == "file-\ufffd.log"
    problem = L.text_problem(bad, 100)
    assert problem is not None and problem[0] == L.BAD_TEXT
    L.clean_text(bad, 100).encode("utf-8")  # encodable now


def test_labels_are_capped() -> None:
    labels = {f"k{i:02d}": "v" for i in range(40)}
    out = L.clean_labels(labels)
    assert out is not None and len(out) == L.MAX_LABELS
    assert out[L.LABELS_DROPPED] == str(40 - (L.MAX_LABELS - 1))
    assert L.clean_labels({"device": "mlx5\x00"}) == {"device": "mlx5\ufffd"}
    assert L.labels_problem(labels) == (L.TOO_MANY, "40 entries, over the limit of 32")
    assert L.labels_problem({"op": "allreduce"}) is None


def test_config_json_cleans_nul_and_replaces_an_oversized_config() -> None:
    assert json.loads(L.config_json({"lr": "3e-3\x00", "k\x00": 1})) == {
        "lr": "3e-3\ufffd",
        "k\ufffd": 1,
    }
    big = json.loads(L.config_json({"blob": "x" * (L.MAX_CONFIG_JSON_CHARS + 1)}))
    assert list(big) == [L.CONFIG_TRUNCATED] and "over the limit" in big[L.CONFIG_TRUNCATED]
    assert L.config_problem(json.dumps({"a": "\x00"})) == (L.NUL, "holds a NUL character")
    assert L.config_problem('{"a": "\\ud800"}') is not None
    assert L.config_problem('{"a": "\\ud83d\\ude00"}') is None  # a real pair is fine
    assert L.config_problem('{"a": 1}') is None


def test_text_problem_names_what_is_wrong() -> None:
    assert L.text_problem("x" * 26_498, 16_384) == (
        L.TOO_LONG,
        "26498 characters, over the limit of 16384",
    )
    assert L.text_problem("ab\x00", 10) == (L.NUL, "NUL character at position 2")
    assert L.text_problem("fine", 10) is None


def test_a_config_that_cannot_be_encoded_becomes_a_marker() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]  # type: ignore[assignment]
    out = json.loads(L.config_json({"deep": deep}))
    assert list(out) == [L.CONFIG_TRUNCATED] and "RecursionError" in out[L.CONFIG_TRUNCATED]
