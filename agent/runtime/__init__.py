"""The agent's runtime core: collectors polled on a clock, identity joined, records to a sink.

    agent = Agent([nvml, ebpf, logs], TraceSink("node.jsonl.gz"), node="node-01")
    agent.run()

See base.py for the record/collector/sink/clock contracts.
"""

from agent.runtime.base import (
    AcceleratedClock,
    Clock,
    Collector,
    ManualClock,
    Record,
    Sink,
    SystemClock,
)
from agent.runtime.identity import IdentityJoin
from agent.runtime.loop import Agent, AgentStats
from agent.runtime.sinks import MemorySink, TraceSink

__all__ = [
    "AcceleratedClock",
    "Agent",
    "AgentStats",
    "Clock",
    "Collector",
    "IdentityJoin",
    "ManualClock",
    "MemorySink",
    "Record",
    "Sink",
    "SystemClock",
    "TraceSink",
]
