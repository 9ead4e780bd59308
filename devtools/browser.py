"""The inspector served in a background thread, and headless Chromium to look at it: what the browser
tests, the screenshots (`python -m devtools.screenshots`) and the benchmark share.

Chromium and its driver are Debian's (`apt-get install chromium chromium-driver`, `make browser`);
selenium drives them. A missing browser is an error, never a skip."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = ("chromedriver", "chromium-driver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(sources: list, config) -> Iterator[str]:
    """The app over `sources` on a free loopback port for the span of the block; yields its base URL."""
    import uvicorn

    from inspector.app import build_app

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(sources, config), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the inspector did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _which(names: tuple[str, ...], package: str) -> str:
    for name in names:
        if path := shutil.which(name):
            return path
    raise RuntimeError(f"{names[0]} not found: install Debian's {package} (make browser)")


def chromium(width: int = 1280, height: int = 900):
    """A headless Chromium driven by selenium through Debian's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _which(CHROMIUM, "chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(service=Service(_which(DRIVER, "chromium-driver")), options=options)
