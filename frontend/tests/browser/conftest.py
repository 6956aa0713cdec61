"""Browser tests: Playwright for Python driving Debian's chromium (headless) against
pytest-django's live server, on a seeded operator (frontend/seeding/).

No browser is downloaded: scripts/setup-system.sh installs `chromium` from Debian and the
tests launch that binary (`executable_path`). Each test seeds its own data before it starts
the browser: the live server reads committed rows (the tests are transactional), and Django
refuses ORM calls from a thread whose asyncio loop Playwright's sync API is running.

`PROOF_SCREENSHOTS=1` (never set in CI) also saves each page to docs/console/<name>.png, from
a somewhat larger seed so that the pictures show a fleet.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from frontend.seeding import SeedResult, SeedSizes, seed_console

CHROMIUM = os.environ.get("PROOF_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("PROOF_SCREENSHOTS", "") not in ("", "0")
SCREENSHOT_DIR = Path(__file__).resolve().parents[3] / "docs" / "console"
VIEWPORT = {"width": 1400, "height": 900}
MAX_SHOT_HEIGHT = 1800


def screenshot_sizes() -> SeedSizes:
    """Enough of a fleet to look like one in the docs' pictures, still seeded in seconds."""
    return SeedSizes(
        nodes=96,
        customers=6,
        jobs=120,
        incidents=600,
        charted_jobs=2,
        series_hours=2.0,
        fleet_minutes=5.0,
        fleet_rollup_hours=6,
        health_days=3,
        other_nodes=4,
        other_jobs=6,
        other_incidents=10,
    )


@pytest.fixture
def seeded(transactional_db: None) -> SeedResult:
    sizes = screenshot_sizes() if SCREENSHOTS else SeedSizes.tiny()
    return seed_console(sizes, slug="browser", analyze=False)


@contextmanager
def chromium() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: scripts/setup-system.sh installs Debian's chromium "
            "(scripts/debian-packages.txt)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: CI and the dev machines run as root, where chromium's sandbox refuses;
        # --disable-dev-shm-usage: a container's small /dev/shm crashes its renderers.
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def shoot() -> Callable[[Any, str], None]:
    """shoot(page, name): the page as docs/console/<name>.png, when PROOF_SCREENSHOTS is set."""

    def save(page: Any, name: str) -> None:
        if SCREENSHOTS:
            SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
            # The top of the page, up to MAX_SHOT_HEIGHT: a whole job page is ~6 MB of PNG.
            height = int(page.evaluate("document.documentElement.scrollHeight"))
            page.screenshot(
                path=str(SCREENSHOT_DIR / f"{name}.png"),
                full_page=True,
                clip={
                    "x": 0,
                    "y": 0,
                    "width": VIEWPORT["width"],
                    "height": min(height, MAX_SHOT_HEIGHT),
                },
            )

    return save
