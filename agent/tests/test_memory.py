from __future__ import annotations

from pathlib import Path

from agent.runtime.memory import peak_rss_mib


def test_peak_rss_reads_vmhwm_of_this_image(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(
        "Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t 40000 kB\n"
    )
    assert peak_rss_mib(status) == 50.0


def test_peak_rss_falls_back_to_getrusage_without_proc(tmp_path: Path) -> None:
    got = peak_rss_mib(tmp_path / "missing")
    assert got > 1  # this process's own maxrss, in MiB


def test_real_proc_status_is_read() -> None:
    assert 1 < peak_rss_mib() < 100_000
