"""The layering of ARCHITECTURE.md, held: `dimmem` starts without the heavy stacks (a stage is imported
only when its subcommand runs), and import-linter's contracts (.importlinter) are kept."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dimmem.paths import REPO_ROOT

# what a stage or the embedder needs; none of it may load for help or windowing
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "deepspeed",
    "matplotlib",
    "sentence_transformers",
    "datasets",
    "onnxruntime",
)
# `python -X importtime` writes one stderr line per module: "import time: self | cumulative | name"
IMPORT_LINE = re.compile(r"^import time:\s+\d+\s+\|\s+\d+\s+\|\s*(?P<module>\S+)\s*$")


def imported_modules(*args: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dimmem", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    modules = {m.group("module") for line in done.stderr.splitlines() if (m := IMPORT_LINE.match(line))}
    assert "dimmem" in modules, done.stderr[-2000:]  # the format was understood
    return modules


@pytest.mark.parametrize("args", [["--help"], ["windows", "--help"]], ids=["dimmem", "windows"])
def test_cli_help_imports_no_heavy_stack(args):
    modules = imported_modules(*args)
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not {m.split(".")[0] for m in loaded}, loaded[:20]


def test_import_contracts_are_kept():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), (
        f"import-linter is not installed next to {sys.executable} (pip install -e '.[test]')"
    )
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize(
    "module, imported, contract",
    [
        ("dimmem/paths.py", "train.export", "The library imports no stage"),
        ("serve/app.py", "devtools.fake_teacher", "The product imports no benchmark or dev tool"),
        ("data_gen/run.py", "benchmarks.datagen", "The product imports no benchmark or dev tool"),
    ],
    ids=["library-stage", "serve-fake-teacher", "datagen-benchmark"],
)
def test_a_forbidden_import_breaks_the_contracts(tmp_path, module, imported, contract):
    """The contracts bite: the same tree with one module importing what it must not fails lint-imports,
    naming the contract that forbids it."""
    import shutil

    tracked = subprocess.run(
        ["git", "ls-files", "*.py", ".importlinter"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.split()
    for name in tracked:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa\n")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and f"{contract} BROKEN" in done.stdout, done.stdout[-3000:]
