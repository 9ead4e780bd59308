"""Running the app under uvicorn with the limits that must hold before the app sees a request.

uvicorn's h11 protocol buffers a request line and headers up to `h11_max_incomplete_event_size` and,
past it, answers 400 and closes while the client is still sending, so the client sees a connection
reset. `GuardedH11Protocol` answers 414 (the request line alone is too long) or 431 (the headers are)
instead, then closes gently: it stops writing, and reads and drops what is still coming (at most
`LINGER_BYTES`, `LINGER_S`), so the client gets to read the answer. The buffer is sized to hold a
request line of `max_url_bytes` and `max_header_bytes` of headers; a URL that fits it but is over
`max_url_bytes` reaches serve.guard, which answers 414 too.
"""

from __future__ import annotations

import logging
import os
import tempfile

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from serve.config import CONFIG_ENV, METRICS_DIR_ENV, ServeConfig
from serve.guard import clip

MAX_URL_ENV = "DIMMEM_MAX_URL_BYTES"
LINGER_S = 10.0
LINGER_BYTES = 16 * 1024 * 1024
REQUEST_LINE_SLACK = 32  # "PATCH " + " HTTP/1.1\r\n"
ACCESS_LOG_PATH_CHARS = 200


class GuardedH11Protocol(H11Protocol):
    _dropped: int | None = None  # bytes read and dropped since the answer; None: not lingering

    @property
    def max_url_bytes(self) -> int:
        """The config's limit, from the environment `serve` sets: worker processes load this class by
        reference, so it carries no state of its own."""
        return int(os.environ.get(MAX_URL_ENV, "8192"))

    def data_received(self, data: bytes) -> None:
        if self._dropped is None:
            super().data_received(data)
            return
        self._dropped += len(data)
        if self._dropped > LINGER_BYTES:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse: 414/431 when it was too long, else 400."""
        pending, _ = self.conn.trailing_data
        status, detail = 400, msg
        if len(pending) > (self.config.h11_max_incomplete_event_size or 16_384):  # "buffer too long"
            line_end = pending.find(b"\n")
            if line_end < 0 or line_end > self.max_url_bytes + REQUEST_LINE_SLACK:
                status, detail = 414, f"URL over {self.max_url_bytes} bytes"
            else:
                status, detail = 431, "request headers too large"
        self.logger.warning("refused a request: %s %s", status, detail)
        body = f'{{"detail": "{detail}"}}'.encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=status, headers=headers),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response already under way: nothing sensible to add
            self.transport.close()
            return
        self._linger()

    def _linger(self) -> None:
        self._dropped = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


class _ClipAccessLog(logging.Filter):
    """The access log repeats at most ACCESS_LOG_PATH_CHARS of a request's path."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (*args[:2], clip(args[2], ACCESS_LOG_PATH_CHARS), *args[3:])
        return True


def clip_access_log() -> None:
    logging.getLogger("uvicorn.access").addFilter(_ClipAccessLog())


def serve(app, config: ServeConfig, log_level: str = "info") -> None:
    """Run the service with uvicorn on the config's host and port, with the request-head limits above:
    `app` in this process, or with `config.workers` > 1 that many worker processes sharing the socket,
    each building its own app from the config (`serve.app.app_from_environment`); uvicorn restarts a
    worker that dies."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ[MAX_URL_ENV] = str(config.max_url_bytes)
    head = config.max_url_bytes + config.max_header_bytes + REQUEST_LINE_SLACK
    common = dict(
        host=config.host,
        port=config.port,
        log_level=log_level,
        http=GuardedH11Protocol,
        h11_max_incomplete_event_size=head,
    )
    clip_access_log()
    if config.workers == 1:
        uvicorn.Server(uvicorn.Config(app, **common)).run()
        return
    os.environ[CONFIG_ENV] = config.model_dump_json()
    server_config = uvicorn.Config(
        "serve.app:app_from_environment", factory=True, workers=config.workers, **common
    )
    # the workers' metrics go to files in a fresh folder of this run, summed by /metrics (serve.deps)
    with tempfile.TemporaryDirectory(prefix="dimmem-metrics-") as metrics_dir:
        os.environ[METRICS_DIR_ENV] = metrics_dir
        Multiprocess(server_config, sockets=[server_config.bind_socket()]).run()
