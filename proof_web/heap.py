"""The web process's garbage collector, set once its application is loaded (wsgi.py, asgi.py;
`proof bench console` does the same so it measures what the servers do).

A console request allocates a few hundred thousand container objects (parsed log lines, chart
points, template nodes): with CPython's default gen-0 threshold of 700 that is tens of young
collections a request, and every tenth of every tenth a full one that walks the whole heap —
Django, numpy, every loaded module and template, none of it garbage. Measured on the console
bench's seed (gc.callbacks, 10 requests a page, load 4-6): 2.3-3.8 ms of collection per
request on the job, price and fleet pages (4-12 collections) and 15 ms on the charted verdict
page (a full one); after this no collection in any of those requests.
Interleaved in one process (4 rounds × 6 requests a page each way, so the shared machine's
drift falls on both), CPU p50 per page with this against CPython's defaults: the charted job
page 80 -> 68 ms, the charted verdict page 97 -> 88, /health/ 85 -> 78, the jobs list 42 -> 40,
/price/, /fleet/ and /incidents/ within 1 ms. Start-up objects are frozen (moved to the
permanent generation: never scanned, and not copied on write by forked workers); the young
threshold raised so a request's own short-lived cycles are collected in a few passes, not
dozens. Memory: at most ~50,000 young
objects wait for a collection (a few MB)."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def settle() -> None:
    """Freeze what start-up allocated and raise the young generation's threshold."""
    gc.collect()  # the start-up garbage goes now, not frozen with the rest
    gc.freeze()
    _young, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
