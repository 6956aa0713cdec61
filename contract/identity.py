"""Identity vocabulary shared by the agent (which keys records) and the engine (which reads
them): what a process's command line says of the job it belongs to."""

from __future__ import annotations

from collections.abc import Iterable

# Inference servers by the program or module they run as (a job's kind when no job record says).
INFERENCE_PROGRAMS = (
    "vllm",
    "vllm.entrypoints",
    "sglang.launch_server",
    "text-generation-launcher",
    "text-generation-server",
    "tritonserver",
    "trtllm-serve",
    "llama-server",
    "ollama",
)


def inference_server(cmd: Iterable[str] | None) -> bool:
    """Whether a command line runs a known inference server (vLLM, SGLang, TGI, Triton, …)."""
    for arg in cmd or ():
        name = arg.rsplit("/", 1)[-1]
        if any(name == p or name.startswith(p + ".") for p in INFERENCE_PROGRAMS):
            return True
    return False
