"""The agent's side of the ingest gRPC API: batch encoding (encode.py), the client with
register, streaming and acks (client.py) and the runtime Sink that ties them together (sink.py).
No Django here."""

from typing import Any

from agent.transport.sink import check_server as _check_server


def check_server(cfg: Any, timeout: float = 10.0) -> None:
    """Prove the configured token with a real Register call (`proof-agent doctor`)."""
    _check_server(cfg, timeout)
