"""Content-Security-Policy on every response: no script but Proof's own files.

The console's pages carry no inline script and no on* handler (their behaviour is in
frontend/static/proof/*.js; data for the charts travels in `<script type="application/json">`
blocks, which a browser never runs), so the policy allows scripts from this origin only, and no
`'unsafe-inline'` / `'unsafe-eval'`: markup injected into a page through some escaping bug
cannot run. Styles: this origin only as well (the templates have no style attribute or
`<style>` block; scripts set styles through the CSSOM, which CSP allows), except on the API's
Swagger page, whose vendored template has one `<style>` block. tenants/tests/test_csp.py crawls
every page a signed-in operator admin reaches and fails on an inline script or a missing header.

A response that already has the header (a view that needs another policy) keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse

HEADER = "Content-Security-Policy"

_BASE: dict[str, str] = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
}


def policy(*, inline_styles: bool = False, websocket_host: str = "") -> str:
    directives = dict(_BASE)
    if inline_styles:
        directives["style-src"] = "'self' 'unsafe-inline'"
    if websocket_host:
        # 'self' covers same-origin WebSockets in CSP 3; spelled out for browsers that predate it
        # (the console's live updates, frontend/static/proof/live.js).
        directives["connect-src"] = f"'self' ws://{websocket_host} wss://{websocket_host}"
    return "; ".join(f"{name} {value}" for name, value in directives.items())


@cache
def _inline_style_paths() -> frozenset[str]:
    try:
        return frozenset({reverse("api-docs")})
    except NoReverseMatch:
        return frozenset()


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER in response:
            return response
        try:
            host = request.get_host()
        except DisallowedHost:
            host = ""
        response[HEADER] = policy(
            inline_styles=request.path in _inline_style_paths(), websocket_host=host
        )
        return response
