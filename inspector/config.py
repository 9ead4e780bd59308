"""The inspector's settings (`configs/inspect/default.yaml`), read by the one config loader."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from dimmem.config import Section
from dimmem.paths import CONFIG_DIR

DEFAULT_CONFIG = CONFIG_DIR / "inspect" / "default.yaml"


class InspectConfig(Section):
    host: str = Field("127.0.0.1", description="address to bind; loopback unless told otherwise")
    port: int = Field(8765, ge=0, le=65535)
    page_size: int = Field(50, ge=1, le=1000, description="rows per page of every list")
    index_dir: str | None = Field(None, description="cache of JSONL line indexes; null: ~/.cache/dimmem")
    memory_config: str | None = Field(None, description="runtime YAML stores are searched with")
    search_k: int = Field(10, ge=1, le=200, description="hits a store search shows")

    def index_path(self) -> Path:
        if self.index_dir:
            return Path(self.index_dir)
        cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(cache) / "dimmem" / "inspect"
