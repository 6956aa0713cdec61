"""The agent's collectors: each turns one node source into trace-v1 records (DESIGN §5).

A collector implements `collect(now: float) -> list[record]`; every OS touchpoint is a
constructor argument, and a source that cannot be read is logged once and yields nothing.
"""
