"""`proof billing usage / chargeback / export / keygen` through the real command."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from billing import licence, metering
from billing.tests.helpers import days_of, rollups
from proof_web import cli
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_usage_export_and_chargeback(
    tmp_path: Path, settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    a = make_tenant("cli-a")
    make_tenant("cli-b")
    op = a.operator.pk
    feb = date(2028, 2, 1)
    rollups(op, {"node-1": ["GPU-1", "GPU-2", "GPU-3"]}, days_of(feb)[:10])
    metering.do_meter_range(op, feb, date(2028, 2, 29))

    assert cli.main(["billing", "usage", "--month", "2028-02", "--operator", "cli-a"]) == 0
    out = capsys.readouterr().out
    assert "GPU-days 30" in out and "GPU-months 1.0345" in out  # 30 / 29
    assert "cli-b" not in out
    assert cli.main(["billing", "usage", "--month", "2028-13"]) == 2
    assert "YYYY-MM" in capsys.readouterr().err

    key_file = tmp_path / "site.pem"
    assert cli.main(["billing", "keygen", "--out", str(key_file)]) == 0
    public = capsys.readouterr().out.split("public key ")[1].strip()
    settings.BILLING_EXPORT_KEY_FILE = str(key_file)
    report_file = tmp_path / "report.json"
    args = ["billing", "export", "--month", "2028-02", "--operator", "cli-a"]
    assert cli.main([*args, "--out", str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    assert report["report"]["gpu_days"] == 30
    assert report["report"]["gpu_days_by_day"]["2028-02-29"] == 0
    assert {g["gpu"] for g in report["report"]["gpus"]} == {"GPU-1", "GPU-2", "GPU-3"}
    assert licence.verify_report(report, public)
    report["report"]["gpu_days"] = 3  # tampered
    assert not licence.verify_report(report, public)

    csv_file = tmp_path / "cb.csv"
    args = ["billing", "chargeback", "--month", "2028-02", "--operator", "cli-a"]
    assert cli.main([*args, "--out", str(csv_file)]) == 0
    assert csv_file.read_text().splitlines()[0].startswith("month,customer,gpus,gpu_hours")
