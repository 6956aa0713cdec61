"""Throughput of the training-log parser: every training and NCCL fixture concatenated x100,
fed through `LogParser.feed` (the collector's path) and stateless `parse_line`.

    .venv/bin/python -m agent.tests.bench_training_parser
"""

from __future__ import annotations

import time
from pathlib import Path

from contract.parsers.training import LogParser, parse_line

DATA = Path(__file__).parent / "data"


def main(repeat: int = 100) -> None:
    base: list[str] = []
    for folder in ("training", "nccl", "deepspeed"):
        for path in sorted((DATA / folder).glob("*.log")):
            base.extend(path.read_text().split("\n"))
    corpus = base * repeat
    for label, fn in (("LogParser.feed", LogParser().feed), ("parse_line", parse_line)):
        start = time.process_time()
        parsed = sum(1 for line in corpus if fn(line) is not None)
        cpu = time.process_time() - start
        print(
            f"{label}: {len(corpus)} lines ({parsed} parsed) in {cpu:.3f} s CPU = "
            f"{len(corpus) / cpu:,.0f} lines/s, {cpu / len(corpus) * 1e6:.2f} us/line"
        )
    unknown = ["INFO some unrelated log line about data loading shard 17 of 64"] * 100_000
    start = time.process_time()
    for line in unknown:
        parse_line(line)
    cpu = time.process_time() - start
    print(f"non-matching line fast path: {len(unknown) / cpu:,.0f} lines/s")


if __name__ == "__main__":
    main()
