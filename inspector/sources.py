"""What each PATH given to `dimmem inspect` is: a datagen output (report.json), an eval run
(metrics.json), or a memory store (a SQLite file or a postgresql:// URL). One that is missing or
malformed becomes a `Broken` source whose page says why, so the other sources stay usable."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dimmem.runtime.stores import is_postgres, sqlite_path
from inspector.config import InspectConfig


@dataclass
class Broken:
    spec: str
    problem: str
    kind = "broken"

    @property
    def name(self) -> str:
        return self.spec

    def summary(self) -> str:
        return self.problem


def open_source(spec: str, config: InspectConfig, memory_config: str):
    """The source `spec` names, or `Broken` with the reason it cannot be read."""
    from inspector.datagen import DatagenOutput
    from inspector.evalrun import EvalRun
    from inspector.store import MemoryStore

    path = Path(sqlite_path(spec))
    try:
        if is_postgres(spec) or path.is_file():
            return MemoryStore(spec, memory_config)
        if (path / "metrics.json").is_file():
            return EvalRun(path, config.index_path())
        if (path / "report.json").is_file():
            return DatagenOutput(path, config.index_path())
        if not path.exists():
            return Broken(spec, f"{spec}: no such file or folder")
        return Broken(
            spec,
            f"{spec}: not a datagen output (report.json), an eval run (metrics.json) or a memory store "
            "(a SQLite file or postgresql://...)",
        )
    except Exception as exc:  # noqa: BLE001 - any failure to open (a database driver's too) is a page, not a crash
        return Broken(spec, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc))
