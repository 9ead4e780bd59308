"""The OpenAPI document of the service, generated from the app and checked in as serve/openapi.json
(a test fails when the two differ: regenerate with `dimmem serve api --openapi serve/openapi.json`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

CHECKED_IN = Path(__file__).with_name("openapi.json")


def openapi_document() -> dict:
    """The app's document; the app is built over an in-memory store and a placeholder key."""
    from dimmem.runtime.memory import Memory
    from serve.app import build_app
    from serve.config import ServeConfig, Tenant

    with mock.patch.dict(os.environ, {"DIMMEM_OPENAPI_KEY": "placeholder"}):
        config = ServeConfig(tenants=[Tenant(name="doc", api_key_env="DIMMEM_OPENAPI_KEY")])
        return build_app(config, memory=Memory({"store": ":memory:"})).openapi()


def write_openapi(path: str | Path = CHECKED_IN) -> Path:
    Path(path).write_text(json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n")
    return Path(path)
