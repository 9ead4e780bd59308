"""Run a server as a child process for as long as a `with` block: started, waited for until its health
URL answers, stopped (with its whole process group) on the way out. Used by the demo, the load
benchmark and the integration tests for both vLLM and the memory service.

    with Service([...], health_url="http://127.0.0.1:8000/v1/models", log="vllm.log") as service:
        ...

A server that exits or never answers raises ServiceError with the tail of its log, which is where
vLLM and uvicorn say what went wrong.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServiceError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class Service:
    def __init__(
        self,
        command: list[str],
        health_url: str,
        log: str | Path,
        env: dict[str, str] | None = None,
        startup_timeout: float = 600.0,
        name: str | None = None,
    ):
        self.command, self.health_url, self.log = command, health_url, Path(log)
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout = startup_timeout
        self.name = name or Path(command[0]).name
        self.process: subprocess.Popen | None = None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Service:
        if self.process is not None and self.process.poll() is None:  # started already: one process
            return self
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        began = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with {self.process.returncode} before it answered; "
                    f"log {self.log}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.health_url, timeout=5) as response:
                    if response.status == 200:
                        self.startup_s = time.monotonic() - began
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - began > self.startup_timeout:
                self.stop()
                raise ServiceError(
                    f"{self.name} did not answer {self.health_url} within {self.startup_timeout:.0f} s; "
                    f"log {self.log}:\n{self.log_tail()}"
                )
            time.sleep(1.0)

    def __exit__(self, *exc) -> None:
        self.stop()

    def workers(self) -> list:
        """The live worker processes (psutil) of a service that runs its app in spawned children
        (`dimmem serve api --workers N`: uvicorn starts them with multiprocessing); a killed worker
        lingers as a zombie until its supervisor reaps it and is not counted."""
        import psutil

        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
        return found

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to the process group (vLLM runs its engine in child processes), SIGKILL after `grace` s."""
        if self.process is None:
            return
        try:
            os.killpg(
                self.process.pid, signal.SIGTERM
            )  # also when the leader is gone: its children may not be
            self.process.wait(timeout=grace)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
