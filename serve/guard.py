"""The service's outermost check, a pure ASGI middleware that answers before any route runs and before
a byte of the body is read:

1. a path + query longer than `max_url_bytes` gets 414, headers over `max_header_bytes` 431;
2. more than one Authorization header gets 400: the guard and what it guards would each pick one, and
   a request holding two tenants' keys would run as whichever the route read;
3. every path but the public ones (/healthz and the API's own description) needs a known key
   (`Authorization: Bearer <key>`), else 401 — also when a huge body is on its way;
4. a declared Content-Length over `max_body_bytes` gets 413 at once; a chunked or undeclared body is
   counted while it streams in and gets 413 the moment it passes the limit, so no more than the limit
   is ever held; a body still arriving after `max_body_seconds` gets 408.

It also counts every request in the metrics, by route template (never the raw path) and status.
A request head too long to reach the app at all (h11 buffers at most the two limits) is answered by
serve.server's protocol: h11 bounds only a head still incomplete, so both checks are needed.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Iterable
from typing import NamedTuple

from starlette.routing import BaseRoute, Match

PUBLIC = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
ECHO_CHARS = 80


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as far as an answer or a log may repeat it."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def bearer(authorization: str | None) -> str | None:
    scheme, _, credentials = (authorization or "").partition(" ")
    return credentials.strip() or None if scheme.lower() == "bearer" else None


def caller(authorization: str | None, callers: dict[str, str]) -> str | None:
    """Who holds the bearer key in `authorization` (`callers`: key -> who), compared in constant time."""
    given = bearer(authorization)
    if given is None:
        return None
    given_bytes = given.encode("latin-1", "replace")  # header values are bytes read as latin-1
    found = None
    for key, who in callers.items():
        if hmac.compare_digest(key.encode("utf-8", "surrogateescape"), given_bytes):
            found = who
    return found


class _Stop(Exception):
    """The guard answered mid-body; whatever the app does with this is dropped."""


class _Refusal(NamedTuple):
    """The guard's answer to a request head it refuses."""

    status: int
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


class _Exchange:
    """One request through the guard: the app's receive and send wrapped, so the body is counted against
    the size and time limits as the app reads it, and the status sent (the guard's or the app's) is known
    for the metrics."""

    def __init__(self, config, receive, send, start: float) -> None:
        self.config, self._receive, self._send = config, receive, send
        self.deadline = start + config.max_body_seconds
        self.status: int | None = None
        self.answered = False  # the guard has answered: the app's own answer is dropped
        self.received, self.body_done = 0, False

    async def reply(self, code: int, detail: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self.answered, self.status = True, code
        body = json.dumps({"detail": detail}).encode()
        await self._send(
            {
                "type": "http.response.start",
                "status": code,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                ],
            }
        )
        await self._send({"type": "http.response.body", "body": body})

    async def send(self, message) -> None:
        if self.answered:  # the guard has said 413/408
            return
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)

    async def receive(self):
        if self.body_done:  # waiting for a disconnect, say: no deadline
            return await self._receive()
        config = self.config
        try:
            message = await asyncio.wait_for(self._receive(), max(self.deadline - time.perf_counter(), 0.001))
        except TimeoutError:
            if self.status is None:
                await self.reply(408, f"request body not complete within {config.max_body_seconds:g} s")
            raise _Stop from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.body_done = not message.get("more_body", False)
            if self.received > config.max_body_bytes:
                if self.status is None:
                    await self.reply(413, f"request body over {config.max_body_bytes} bytes")
                raise _Stop
        return message


class Guard:
    def __init__(self, app, *, state, routes: Iterable[BaseRoute]) -> None:
        self.app, self.state, self.routes = app, state, routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        exchange = _Exchange(self.state.config, receive, send, start)
        try:
            if (refusal := self._refusal(scope)) is not None:
                await exchange.reply(*refusal)
            else:
                await self.app(scope, exchange.receive, exchange.send)
        except _Stop:
            pass
        except Exception:
            if not exchange.answered:
                raise
        finally:
            route = scope.get("route")
            path = route.path if route is not None else self._template(scope)
            self.state.metrics.requests.labels(path, str(exchange.status or 500)).inc()
            self.state.metrics.latency.labels(path).observe(time.perf_counter() - start)

    def _refusal(self, scope) -> _Refusal | None:
        """What the request's head alone is refused with, the first check it fails in the order of the
        module's docstring; None: the app runs."""
        config = self.state.config
        headers = dict(scope["headers"])  # the last of a repeated header
        authorizations = sum(name == b"authorization" for name, _ in scope["headers"])
        url_bytes = len(scope.get("raw_path") or scope["path"].encode()) + len(scope["query_string"])
        declared = headers.get(b"content-length")
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        if url_bytes > config.max_url_bytes:
            return _Refusal(414, f"URL over {config.max_url_bytes} bytes")
        if header_bytes > config.max_header_bytes:
            return _Refusal(431, f"request headers over {config.max_header_bytes} bytes")
        if authorizations > 1:
            return _Refusal(400, f"{authorizations} Authorization headers; at most one")
        if scope["path"] not in PUBLIC and (
            caller(headers.get(b"authorization", b"").decode("latin-1"), self.state.callers) is None
        ):
            return _Refusal(401, "missing or unknown API key", ((b"www-authenticate", b"Bearer"),))
        if declared is not None and (not declared.isdigit() or int(declared) > config.max_body_bytes):
            return _Refusal(413, f"request body over {config.max_body_bytes} bytes")
        return None

    def _template(self, scope) -> str:
        """The route template a request the guard refused would have reached ("unmatched": none)."""
        for route in self.routes:
            if route.matches(scope)[0] is Match.FULL:
                return getattr(route, "path", "unmatched")
        return "unmatched"
