"""The web playground: a page at `/` and its assets at `/static/<name>`, all from the package
(`serve/static/`), so that it works offline. The page and its assets are public, like /health:
they hold no data, and the API behind them keeps its key (the page sends it as a Bearer token).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.exceptions import HTTPException

# Everything the page may load, run or call is this origin's. Audio blobs play from `blob:` URLs
# made by the page itself; nothing may frame the page, and no form or <base> can point elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self' blob:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

ASSETS = {
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
"""The files under /static (a fixed set: no path from the request reaches the file system)."""

PAGE = "index.html"
PATHS = ("/", "/favicon.ico") + tuple(f"/static/{name}" for name in ASSETS)
"""The playground's paths: public even when the server has an API key."""

_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def playground_router() -> APIRouter:
    """`/` (the page, with a strict Content-Security-Policy) and `/static/<name>`. The files are
    read once, here: a few kilobytes, and a missing one fails when the app is made."""
    page = _read(PAGE)
    assets = {name: (_read(name), media) for name, media in ASSETS.items()}
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    async def playground_page():
        return Response(page, media_type="text/html; charset=utf-8",
                        headers={**_HEADERS, "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"})

    @router.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        data, media = assets["favicon.svg"]
        return Response(data, media_type=media, headers=_HEADERS)

    @router.get("/static/{name}", include_in_schema=False)
    async def static_asset(name: str):
        if name not in assets:
            raise HTTPException(404, f"no static file {name!r}")  # the app's JSON error shape
        data, media = assets[name]
        return Response(data, media_type=media, headers=_HEADERS)

    return router
