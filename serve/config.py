"""The memory service's configuration (`configs/serve/*.yaml`), loaded like every other config
(`dimmem.config.load_config`: YAML, then dotted overrides). API keys never live in the file: each
tenant names the environment variable that holds its key, and so does the operator (who alone reads
/metrics). The service refuses to start when two tenants share a name, a variable or a key, or when a
variable is unset or empty, and says which variables (never the keys)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dimmem.config import Section, load_config
from serve.schemas import UserId

CONFIG_ENV = "DIMMEM_SERVE_CONFIG"  # the validated config as JSON, for `--workers` processes
# prometheus_client's multiprocess mode: set by `serve` for --workers > 1, read by /metrics
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
MIN_KEY_CHARS = 16  # shorter keys are accepted with a warning (serve/cli.py prints it)


class Tenant(Section):
    name: str = Field(
        min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@:\-]+$", description="prefixes its user ids"
    )
    api_key_env: str = Field(min_length=1)


class ServeConfig(Section):
    memory_config: str = Field(
        "configs/memory/default.yaml",
        description="the runtime: extractor, parser, consolidator (configs/memory/)",
    )
    store: str | None = Field(None, description="overrides the memory config's store")
    student: bool = Field(
        False,
        description="the shipped student extracts (the memory config's `extractor: student`): llama.cpp on "
        "this machine, built on first use",
    )
    tenants: list[Tenant] = Field(min_length=1)
    operator_key_env: str | None = Field(
        None,
        min_length=1,
        description="the variable holding the operator's key, the only key that reads /metrics "
        "(tenant keys get 403); null: /metrics is off (404)",
    )
    max_body_bytes: int = Field(1_048_576, ge=1, description="larger bodies get 413, also when chunked")
    max_body_seconds: float = Field(60.0, gt=0, description="a body still arriving after this long gets 408")
    max_url_bytes: int = Field(8_192, ge=256, description="a longer path + query gets 414")
    max_header_bytes: int = Field(16_384, ge=1_024, description="headers over this get 431")
    max_messages: int = Field(2_000, ge=1, description="per add/extract request")
    max_k: int = Field(100, ge=1, description="search hits per request, at most")
    max_page_size: int = Field(1_000, ge=1, description="GET /v1/memories: a larger limit is capped to this")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(
        1, ge=1, description="worker processes; more than one needs a store they can share (Postgres)"
    )

    @field_validator("tenants")
    @classmethod
    def _distinct_tenants(cls, tenants: list[Tenant]) -> list[Tenant]:
        for what, values in (
            ("names", [t.name for t in tenants]),
            ("api_key_env variables", [t.api_key_env for t in tenants]),
        ):
            if repeated := sorted({v for v in values if values.count(v) > 1}):
                raise ValueError(f"{what} must be distinct ({', '.join(repeated)} repeated)")
        return tenants

    @model_validator(mode="after")
    def _operator_apart(self) -> ServeConfig:
        if self.operator_key_env in {t.api_key_env for t in self.tenants}:
            raise ValueError(f"operator_key_env {self.operator_key_env} is also a tenant's api_key_env")
        return self

    def memory_overrides(self) -> list[str]:
        """What this service sets in its memory config: the student as the extractor, or nothing."""
        from dimmem.runtime.backends import chosen

        return chosen("student") if self.student else []

    def _variables(self) -> dict[str, str]:
        """Variable -> who it names ("tenant a", "the operator")."""
        who = {t.api_key_env: f"tenant {t.name}" for t in self.tenants}
        if self.operator_key_env:
            who[self.operator_key_env] = "the operator"
        return who

    def _read_keys(self) -> dict[str, str]:
        """Variable -> key, every one set, non-empty, without whitespace and distinct; else ValueError
        naming the variables (a key itself is never said)."""
        who = self._variables()
        missing = [v for v in who if not os.environ.get(v, "").strip()]
        if missing:
            raise ValueError(
                f"no API key in the environment for {', '.join(missing)} (unset or empty): "
                "set them before starting the service"
            )
        keys = {v: os.environ[v] for v in who}
        if spaced := [v for v, key in keys.items() if any(c.isspace() for c in key)]:
            raise ValueError(f"the API key in {', '.join(spaced)} contains whitespace: a bearer token cannot")
        by_key: dict[str, list[str]] = {}
        for variable, key in keys.items():
            by_key.setdefault(key, []).append(variable)
        for variables in by_key.values():
            if len(variables) > 1:
                named = " and ".join(f"{v} ({who[v]})" for v in variables)
                raise ValueError(f"{named} hold the same API key: give each its own")
        return keys

    def keys(self) -> dict[str, str]:
        """API key -> tenant name."""
        keys = self._read_keys()
        return {keys[t.api_key_env]: t.name for t in self.tenants}

    def operator_key(self) -> str | None:
        return self._read_keys()[self.operator_key_env] if self.operator_key_env else None

    def weak_keys(self) -> list[str]:
        """The variables whose key is shorter than MIN_KEY_CHARS (a warning, not a refusal)."""
        return [v for v, key in self._read_keys().items() if len(key) < MIN_KEY_CHARS]


class McpConfig(ServeConfig):
    """`dimmem serve mcp` (configs/serve/mcp.yaml): the service's settings, so one file can serve both and
    share a store, with defaults for a local agent: an MCP client starts the server in a working directory
    of its own choosing, so nothing here defaults to a path relative to it."""

    transport: Literal["stdio", "http"] = Field(
        "stdio", description="stdio: one local client, no keys; http: streamable HTTP, tenants and keys"
    )
    user: UserId = Field("me", description="the user of tool calls that name none")
    path: str = Field("/mcp", pattern=r"^/[A-Za-z0-9_./\-]*$", description="http: the MCP endpoint")
    port: int = Field(8081, ge=0, le=65535)
    memory_config: str | None = Field(
        None,
        description="the runtime (configs/memory/); null: its defaults (the rule extractor, rules for "
        "queries and updates)",
    )
    store: str | None = Field(
        None,
        description="overrides the memory config's store; null without a memory config: "
        "<data dir>/dimmem/memory.sqlite",
    )
    tenants: list[Tenant] = Field([], description="http: the tenants and the variables of their keys")
    max_result_bytes: int = Field(
        1_000_000,
        ge=1_024,
        description="a tool answer larger than this on the wire is a tool error naming it: the SDK's HTTP "
        "client refuses a server-sent event over 1 MiB, so keep it below that, with room for the envelope",
    )

    @model_validator(mode="after")
    def _transport(self) -> McpConfig:
        if self.transport == "http" and not self.tenants:
            raise ValueError("transport http needs tenants: each a name and the api_key_env of its key")
        if self.workers != 1:
            raise ValueError("workers: the MCP server runs in one process (its sessions live in it)")
        return self

    def runtime_store(self) -> str | None:
        """The store that overrides the memory config's: `store`, else, when the runtime's defaults are used
        (whose store is a file in the working directory), a SQLite file in the user's data folder."""
        if self.store is not None or self.memory_config is not None:
            return self.store
        data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        return str(Path(data) / "dimmem" / "memory.sqlite")


def load_serve_config(
    path: str | Path | None, overrides: Mapping[str, Any] | Iterable[str] = (), **fields: Any
) -> ServeConfig:
    """The file, then dotted `overrides` (`--set max_k=50`), then keyword fields (flags; None: not given)."""
    return load_config(ServeConfig, path, overrides, **fields)
