"""The local writer's plumbing: the default GGUF comes from the installed package (assembled,
SHA-256 checked), and Gemma's missing system role is folded into the first user turn."""

from __future__ import annotations

from investigator.model import default_model_path, system_into_user


def test_the_default_model_is_the_packages_gguf() -> None:
    path = default_model_path()
    assert path.name == "gemma-3-270m-q4_k_m.gguf"
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert default_model_path() == path  # assembled once, then only verified


def test_the_system_message_heads_the_first_user_turn() -> None:
    merged = system_into_user(
        [{"role": "system", "content": "RULES"}, {"role": "user", "content": "FACTS"}]
    )
    assert merged == [{"role": "user", "content": "RULES\n\nFACTS"}]
    assert system_into_user([{"role": "user", "content": "x"}]) == [
        {"role": "user", "content": "x"}
    ]
