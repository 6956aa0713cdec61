"""Content-Security-Policy (issue 16): every page has the header, and no page carries script the
policy would block — no inline <script>, no on* handler, no javascript: URL.

"Every page" is found, not listed: the test signs in (operator admin, customer viewer) on a
tiny console seed and follows every same-origin link the pages offer, so a page added later is
checked without anyone remembering to add it here. The pages reached without signing in, the
staff admin and the API's Swagger page are requested too.
"""

from __future__ import annotations

import re
from collections import deque
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from frontend.seeding import SeedResult, SeedSizes, seed_console
from tenants.csp import HEADER

pytestmark = pytest.mark.django_db

# Not pages, or pages that act on a GET: never followed.
SKIP = re.compile(r"^/(logout/|admin/logout/|static/|api/v1/(?!docs/)|.*\.(csv|json|md)$)")
EXECUTABLE_TYPES = {"", "text/javascript", "application/javascript", "module"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.problems: list[str] = []
        self.style_problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name.lower(): value or "" for name, value in attrs}
        for name, value in values.items():
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...> (an inline event handler)")
            if name in ("href", "src", "action", "formaction") and value.strip().lower().startswith(
                "javascript:"
            ):
                self.problems.append(f"<{tag} {name}={value!r}> (a javascript: URL)")
        # style-src 'self': an inline style would be dropped (the admin's and Swagger's vendored
        # templates aside, checked apart).
        if "style" in values:
            self.style_problems.append(f"<{tag} style=...> (an inline style)")
        if tag == "style":
            self.style_problems.append("<style> block")
        if tag == "script" and "src" not in values:
            kind = values.get("type", "").strip().lower()
            if kind in EXECUTABLE_TYPES:
                self.problems.append("<script> without src (inline script)")
        if tag == "a" and values.get("href"):
            self.links.append(values["href"])


def _check(client: Client, url: str, seen: dict[str, list[str]]) -> list[str]:
    """Request `url`; note its problems in `seen`; return the links it offers."""
    response = client.get(url)
    problems: list[str] = []
    if HEADER not in response:
        problems.append(f"no {HEADER} header")
    else:
        policy = response[HEADER]
        script_src = next((d for d in policy.split(";") if d.strip().startswith("script-src")), "")
        if script_src.split()[1:] != ["'self'"]:
            problems.append(f"script-src is not 'self' alone: {script_src!r}")
        if "unsafe-eval" in policy or ("unsafe-inline" in policy and url != "/api/v1/docs/"):
            problems.append(f"unsafe policy: {policy}")
    links: list[str] = []
    if response.status_code == 200 and "html" in response.get("Content-Type", ""):
        page = _Page()
        page.feed(response.content.decode())
        problems += page.problems
        if not url.startswith(("/admin/", "/api/v1/docs/")):
            problems += page.style_problems
        links = page.links
    seen[url] = problems
    return links


def _shape(path: str, query: str) -> str:
    """A page's kind: ids in the path and query values left out (/jobs/123/?sort=x ->
    /jobs/*/?sort), so the crawl requests a few of each kind rather than every job and sort."""
    parts = [("*" if re.search(r"\d", part) else part) for part in path.split("/")]
    keys = sorted({pair.split("=", 1)[0] for pair in query.split("&") if pair})
    return "/".join(parts) + ("?" + "&".join(keys) if keys else "")


def _crawl(client: Client, start: list[str], limit: int = 70) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    shapes: dict[str, int] = {}
    queue = deque(start)
    while queue and len(seen) < limit:
        url = queue.popleft()
        if url in seen:
            continue
        for href in _check(client, url, seen):
            parts = urlsplit(urljoin(url, href))
            if parts.netloc or not parts.path.startswith("/") or SKIP.match(parts.path):
                continue  # another origin, or not a page
            local = parts.path + (f"?{parts.query}" if parts.query else "")
            shape = _shape(parts.path, parts.query)
            if local not in seen and shapes.get(shape, 0) < 2:
                shapes[shape] = shapes.get(shape, 0) + 1
                queue.append(local)
    return seen


@pytest.fixture
def seeded() -> SeedResult:
    return seed_console(SeedSizes.tiny(), slug="csptest", analyze=False)


def test_every_page_has_the_policy_and_no_inline_script(seeded: SeedResult) -> None:
    seen: dict[str, list[str]] = {}
    anonymous = Client()
    for url in ("/login/", "/admin/login/", "/password/set/x/y/"):
        _check(anonymous, url, seen)
    reached: dict[str, set[str]] = {}
    for role in ("operator_admin", "customer_viewer"):
        login = seeded.main.logins[role]
        client = Client()
        assert client.login(username=login.username, password=login.password)
        pages = _crawl(client, ["/", "/settings/"])
        reached[role] = {urlsplit(u).path for u in pages}
        seen.update({f"{u} ({role})": problems for u, problems in pages.items()})
    staff = get_user_model().objects.create_user(
        username="csp-staff", password="x-staff-pw", is_staff=True, is_superuser=True
    )
    admin = Client()
    admin.force_login(staff)
    for url in ("/admin/", "/admin/tenants/operator/", "/admin/tenants/operator/add/"):
        _check(admin, url, seen)
    _check(admin, "/api/v1/docs/", seen)
    # Swagger UI's start-up script, no longer inline, is served from the page's own URL.
    docs = admin.get("/api/v1/docs/").content.decode()
    (script_url,) = re.findall(r'<script src="(/api/v1/docs/\?script=[^"]*)"', docs)
    script = admin.get(script_url.replace("&amp;", "&"))
    assert script.status_code == 200 and "SwaggerUIBundle" in script.content.decode()
    # The crawl reached the pages that matter (not only redirects to the login page).
    paths = reached["operator_admin"]
    for must in ("/fleet/", "/jobs/", "/incidents/", "/settings/users/", "/settings/api-tokens/"):
        assert must in paths, f"{must} was not reached: {sorted(paths)}"
    for role, paths in reached.items():
        assert any(re.match(r"^/jobs/.+/$", p) for p in paths), f"no job page for {role}"
        assert any(re.match(r"^/incidents/[0-9a-f-]{36}/$", p) for p in paths), role
    bad = {url: problems for url, problems in seen.items() if problems}
    assert not bad, f"pages breaking the Content-Security-Policy: {bad}"


def test_the_policy_forbids_inline_script_and_framing(client: Client) -> None:
    response = client.get("/login/")
    directives = {
        name: value
        for name, _, value in (part.strip().partition(" ") for part in response[HEADER].split(";"))
    }
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["object-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["base-uri"] == "'none'"


def test_the_page_check_catches_what_the_policy_would_block() -> None:
    """The crawl's checker itself: it must flag each kind, or the crawl proves nothing."""
    page = _Page()
    page.feed(
        '<script>alert(1)</script><script type="module">x()</script>'
        '<button onclick="go()">go</button><a href="javascript:go()">go</a>'
        '<script src="/static/proof/live.js"></script>'
        '<script type="application/json" id="data">{"a": 1}</script>'
    )
    assert len(page.problems) == 4, page.problems
    page.feed('<p style="color: red">x</p><style>p {}</style>')
    assert len(page.style_problems) == 2, page.style_problems
