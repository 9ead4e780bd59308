"""The memory service's configuration (`configs/serve/*.yaml`), loaded like every other config
(`dimmem.config.load_config`: YAML, then dotted overrides). API keys never live in the file: each
tenant names the environment variable that holds its key."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from dimmem.config import Section, load_config


class Tenant(Section):
    name: str = Field(min_length=1)
    api_key_env: str = Field(min_length=1)


class ServeConfig(Section):
    memory_config: str = Field(
        "configs/memory/default.yaml",
        description="the runtime: extractor, parser, consolidator (configs/memory/)",
    )
    store: str | None = Field(None, description="overrides the memory config's store")
    tenants: list[Tenant] = Field(min_length=1)
    max_body_bytes: int = Field(1_048_576, ge=1)
    max_messages: int = Field(2_000, ge=1, description="per add/extract request")
    max_k: int = Field(100, ge=1, description="search hits per request, at most")
    max_page_size: int = Field(1_000, ge=1, description="GET /v1/memories: a larger limit is capped to this")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)

    def keys(self) -> dict[str, str]:
        """API key -> tenant name; a tenant whose variable is unset cannot log in (and is named)."""
        missing = [t.api_key_env for t in self.tenants if not os.environ.get(t.api_key_env)]
        if missing:
            raise ValueError(
                f"no API key in the environment for {missing}: set them before starting the service"
            )
        return {os.environ[t.api_key_env]: t.name for t in self.tenants}


def load_serve_config(
    path: str | Path | None, overrides: Mapping[str, Any] | Iterable[str] = (), **fields: Any
) -> ServeConfig:
    """The file, then dotted `overrides` (`--set max_k=50`), then keyword fields (flags; None: not given)."""
    return load_config(ServeConfig, path, overrides, **fields)
