"""Scraping a Prometheus `/metrics` endpoint: the transport half shared by the dcgm-exporter
and inference-server collectors.

`Scraper.scrape()` fetches and parses; it returns None (after logging once) when the endpoint
cannot be reached or answers something that is not an exposition, so callers just skip.
"""

from __future__ import annotations

import logging

from agent.collectors._common import FetchFn, WarnOnce, http_get
from contract.parsers.prometheus import ParseCache, Scrape, parse_text

log = logging.getLogger(__name__)


class Scraper:
    def __init__(
        self,
        url: str,
        *,
        fetch: FetchFn = http_get,
        timeout_s: float = 2.0,
        warn: WarnOnce | None = None,
    ) -> None:
        self.url = url
        self._fetch = fetch
        self._timeout_s = timeout_s
        self._warn = warn or WarnOnce(log)
        self._cache = ParseCache()

    def scrape(self) -> Scrape | None:
        try:
            body = self._fetch(self.url, self._timeout_s)
        except (OSError, ValueError) as exc:  # URLError/HTTPError/timeouts are OSError
            self._warn.fail(self.url, "cannot scrape %s: %s", self.url, exc)
            return None
        result = parse_text(body, self._cache)
        if not result.samples:
            self._warn.fail(self.url, "scrape of %s returned no samples", self.url)
            return None
        if result.errors:
            self._warn.fail(
                self.url + "#errors",
                "scrape of %s: %d malformed lines skipped, first: %s",
                self.url,
                len(result.errors),
                result.errors[0],
            )
        self._warn.ok(self.url)
        return result
