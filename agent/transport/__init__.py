"""The agent's side of the ingest gRPC API: batch encoding (encode.py), the client with
register, streaming and acks (client.py) and the runtime Sink that ties them together (sink.py).
No Django here."""
