"""The web console: `GET /` (one page: chat, the denoising view, the planner, live metrics), its static files
under `/console/assets/` (the package's `server/console/static/`: plain HTML, CSS and JavaScript modules, no build step,
nothing fetched from anywhere else), its sign-in, and `GET /console/config` (what the page needs to know of the
served model). `--no-web-console` leaves all of them out.

With an API key, the page is behind it: a browser without a session gets the sign-in page instead, whose form
posts the key to `/console/sign-in` (a wrong one is a 401 with the form again); the right key starts a session
(guards.Credentials' cookie) and leads back to the page, whose calls then carry the cookie. The static files
are public: the same for everyone, they hold no data. Every page is served with a Content-Security-Policy that
allows this origin only, so the page cannot reach any other host. Knows nothing of the engine beyond the
served model's numbers it is given.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from diffuserve.server.guards import CONSOLE_PREFIX, Credentials, request_headers
from diffuserve.server.response_models import ConsoleConfig

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
}
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
PROBLEM_MARK = "<!--problem-->"
"""Where the sign-in page says what went wrong."""


def load_assets() -> dict[str, bytes]:
    """Every file of the package's `server/console/static/`, by name."""
    folder = resources.files("diffuserve.server.console").joinpath("static")
    return {item.name: item.read_bytes() for item in folder.iterdir() if item.is_file()}


@dataclass(frozen=True)
class Console:
    credentials: Credentials
    config: ConsoleConfig
    assets: dict[str, bytes]

    def page(self, name: str, status: int = 200, problem: str | None = None) -> Response:
        body = self.assets[name].decode()
        if problem is not None:
            body = body.replace(
                PROBLEM_MARK, f'<p class="problem" role="alert">{html.escape(problem, quote=False)}</p>'
            )
        return Response(body, status, headers=PAGE_HEADERS, media_type=CONTENT_TYPES[".html"])

    def asset(self, name: str) -> Response:
        suffix = name[name.rfind(".") :] if "." in name else ""
        if name not in self.assets or suffix not in CONTENT_TYPES or suffix == ".html":
            return Response("not found", 404, media_type="text/plain")
        return Response(self.assets[name], headers=PAGE_HEADERS, media_type=CONTENT_TYPES[suffix])

    async def sign_in(self, request: Request) -> Response:
        """The sign-in form's POST: the right key starts a session and leads to the page."""
        if not self.credentials.required:
            return RedirectResponse("/", 303)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        key = (form.get("key") or [""])[0]
        if not key.strip():
            return self.page("sign-in.html", 401, "Enter the server's API key (--api-key or DIFFUSERVE_API_KEY).")
        if not self.credentials.key_matches(key):
            return self.page("sign-in.html", 401, "That is not this server's API key; check it and try again.")
        response = RedirectResponse("/", 303)
        response.headers["Set-Cookie"] = self.credentials.set_cookie(secure=request.url.scheme == "https")
        return response


def console_routes(console: Console) -> APIRouter:
    """The page, its sign-in and its static files (left out of the OpenAPI schema: they are not the API)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def index(request: Request) -> Response:
        if not console.credentials.allow(request_headers(request.scope)):
            return console.page("sign-in.html")  # a page to sign in on, not a failure (a 401 would log one)
        return console.page("console.html")

    @router.post("/console/sign-in")
    async def sign_in(request: Request) -> Response:
        return await console.sign_in(request)

    @router.get(CONSOLE_PREFIX + "{name}")
    async def asset(name: str) -> Response:
        return console.asset(name)

    return router


def console_api_routes(console: Console) -> APIRouter:
    """What the page asks the server (behind the API key like the rest of the API)."""
    router = APIRouter()

    @router.get("/console/config")
    async def config() -> ConsoleConfig:
        return console.config

    return router
