"""The memory service's configuration (`configs/serve/*.yaml`). API keys never live in the file: each
tenant names the environment variable that holds its key."""
from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    api_key_env: str


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory_config: str = "configs/memory/default.yaml"  # the runtime: extractor, parser, consolidator
    store: str | None = None  # overrides the memory config's store
    tenants: list[Tenant]
    max_body_bytes: int = 1_048_576
    max_messages: int = 2_000  # per add/extract request
    max_k: int = 100
    host: str = "127.0.0.1"
    port: int = 8080

    def keys(self) -> dict[str, str]:
        """API key -> tenant name; a tenant whose variable is unset cannot log in (and is named)."""
        missing = [t.api_key_env for t in self.tenants if not os.environ.get(t.api_key_env)]
        if missing:
            raise ValueError(f"no API key in the environment for {missing}: set them before starting the service")
        return {os.environ[t.api_key_env]: t.name for t in self.tenants}


def load_serve_config(path: str | Path, **overrides) -> ServeConfig:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ServeConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid serve config:\n{exc}") from None
