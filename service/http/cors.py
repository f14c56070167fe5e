"""Cross-origin requests (CORS) on the HTTP API: off unless --http-cors-origins names origins.

On, an OPTIONS preflight from an allowed origin ("*": any) to a route that exists is answered 204
with the route's methods, the headers a client may send and how long to keep the answer; every
response to an allowed origin, streams and errors too, carries Access-Control-Allow-Origin and
exposes x-request-id and Retry-After. Off (or from another origin), OPTIONS is a 405 like any
method a route does not serve.
"""

from __future__ import annotations

from aiohttp import web

ALLOWED_HEADERS = "authorization, content-type, x-request-id"
EXPOSED_HEADERS = "x-request-id, retry-after"
MAX_AGE_SECONDS = 600


class Cors:
    def __init__(self, origins: tuple[str, ...]) -> None:
        self.origins = frozenset(origins)

    def allowed(self, request: web.BaseRequest) -> str | None:
        """The Access-Control-Allow-Origin for this request's Origin, None when it gets none."""
        origin = request.headers.get("Origin", "")
        if not origin or not self.origins:
            return None
        return "*" if "*" in self.origins else origin if origin in self.origins else None

    def preflight(self, request: web.Request, missing: web.HTTPException | None) -> web.Response | None:
        """The 204 answer to a preflight from an allowed origin to a route that exists; else None."""
        if request.method != "OPTIONS" or not isinstance(missing, web.HTTPMethodNotAllowed):
            return None
        if self.allowed(request) is None:
            return None
        methods = ", ".join(sorted({*missing.allowed_methods, "OPTIONS"}))
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": methods,
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": str(MAX_AGE_SECONDS),
            },
        )

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every response to an allowed origin says so, as its headers go out (streams included)."""
        origin = self.allowed(request)
        if origin is None:
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        if origin != "*":
            response.headers["Vary"] = "Origin"
