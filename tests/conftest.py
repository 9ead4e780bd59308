from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from dimmem.contract.conversation import Conversation, Turn
from dimmem.paths import CONFIG_DIR, shared_data

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub: everything they load is local
SESSIONS = Path(tempfile.gettempdir()) / "dimmem-pytest"


def pytest_configure(config):
    """Each session its own temporary folder, named by its process. pytest's numbered folders are shared
    and rotated: a second session on the machine would delete the first one's (its embedded Postgres
    included). Folders of sessions no longer running are removed."""
    if config.option.basetemp is not None:
        return
    SESSIONS.mkdir(exist_ok=True)
    for folder in SESSIONS.iterdir():
        if folder.name.isdigit() and not _running(int(folder.name)):
            shutil.rmtree(folder, ignore_errors=True)
    config.option.basetemp = str(SESSIONS / str(os.getpid()))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pytest_sessionfinish(session, exitstatus):
    """No process a test started outlives the session: any still running is stopped, named, and fails
    the run."""
    import psutil

    left = psutil.Process().children(recursive=True)
    if not left:
        return
    names = []
    for child in left:
        try:
            names.append(" ".join(child.cmdline())[:200])
            child.kill()
        except psutil.NoSuchProcess:
            continue
    if names:
        print("\nprocesses the tests started and left running (stopped now):\n  " + "\n  ".join(names))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def locomo_path():
    return shared_data("locomo/locomo10.json")


@pytest.fixture(scope="session")
def memorybank_path():
    return shared_data("corpora/memorybank_en/memory_bank_en.json")


@pytest.fixture(scope="session")
def embedder():
    """The runtime's default embedder (ONNX all-MiniLM-L6-v2), loaded once for the session."""
    from dimmem.runtime.embed import make_embedder

    return make_embedder()


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from dimmem.contract.tokens import load_tokenizer

    return load_tokenizer(str(shared_data("qwen3-tokenizer")))


def make_conversation(n_turns: int, sessions: int = 1, text: str = "hello there") -> Conversation:
    """A two-person conversation of n_turns spread over `sessions` dated sessions."""
    per = -(-n_turns // sessions)
    turns = [
        Turn(
            id=f"D{i // per + 1}:{i % per + 1}",
            speaker=("Ann", "Bob")[i % 2],
            role="participant",
            text=f"{text} {i}",
            session_id=f"S{i // per + 1}",
            session_time=f"2024-01-{i // per + 1:02d}T10:00",
        )
        for i in range(n_turns)
    ]
    return Conversation(id="c", turns=turns)


# --- the runtime's two store backends (ARCHITECTURE.md: every behavioural test runs on both) ---------------
# `backend` is "sqlite" or "postgres"; the Postgres parameter is an integration test (plain `pytest` stays
# fast; `make test` runs `-m ""`). One embedded Postgres serves the whole session; each store a test asks
# for is a fresh database, copied from a migrated template, so tests never see each other's rows.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    """The session's embedded Postgres (tests/pg_server.py), started on first use."""
    from pg_server import start

    server = start(tmp_path_factory.mktemp("pg") / "data")
    print(f"embedded Postgres started in {server.start_seconds:.2f} s")
    yield server
    server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def store_urls(backend, tmp_path, request):
    """`store_urls(name)`: the URL of this test's store `name` (one per name; each a fresh empty store)."""
    made: dict[str, str] = {}

    def url(name: str = "m") -> str:
        if name not in made:
            if backend == "sqlite":
                made[name] = str(tmp_path / f"{name}.sqlite")
            else:
                made[name] = request.getfixturevalue("pg_server").fresh_database()
        return made[name]

    return url


@pytest.fixture
def store_url(store_urls) -> str:
    return store_urls("m")


@pytest.fixture
def memory_factory(store_urls):
    """`memory_factory(config=None, store="m", **components)`: a Memory over this test's store `store`
    (closed after the test)."""
    from dimmem.runtime.memory import Memory

    made = []

    def factory(config: dict | None = None, *, store: str = "m", **components):
        memory = Memory({**(config or {}), "store": store_urls(store)}, **components)
        made.append(memory)
        return memory

    yield factory
    for memory in made:
        memory.close()


@pytest.fixture(scope="session")
def toy_dataset(tmp_path_factory):
    """A small oracle-labelled toy datagen output (its dataset: the corpus tiny models are built from)."""
    from data_gen.config import DatagenConfig
    from data_gen.run import run as datagen

    out = tmp_path_factory.mktemp("toy")
    datagen(
        DatagenConfig.model_validate(
            {
                "source": {"format": "toy", "conversations": 10, "sessions": 2},
                "out": str(out),
                "windows": {"window": 10, "overlap": 2, "max_tokens": None},
                "teacher": {"kind": "oracle"},
                "tasks": {"parse_query": False, "consolidate": False},
                "split": {"validation": 0.1, "test": 0.2},
            }
        ),
        show_progress=False,
    )
    return out


@pytest.fixture(scope="session")
def random_tiny_model(toy_dataset, tmp_path_factory):
    """A random one-layer Qwen3 with a tokenizer retrained on the toy dataset: it writes no JSON."""
    from train.tiny import build_tiny_base

    return build_tiny_base(
        tmp_path_factory.mktemp("random-tiny") / "base",
        toy_dataset / "dataset",
        str(shared_data("qwen3-tokenizer")),
        vocab_size=600,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        intermediate_size=128,
    )


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory):
    """The demo's recipe: toy data from the oracle, the tiny model trained and exported merged (fewer steps
    leave it writing runaway strings, which structured outputs cannot end: 80 steps truncated every
    answer); then a pure LoRA adapter (no modules_to_save, as on a pretrained base) trained over it."""
    from data_gen.config import DatagenConfig
    from data_gen.run import run
    from train.__main__ import main as train
    from train.export import main as export_run

    root = tmp_path_factory.mktemp("served")
    datagen = yaml.safe_load((CONFIG_DIR / "datagen" / "toy.yaml").read_text())
    datagen.update(
        out=str(root / "data"), tasks={"extract": True, "parse_query": False, "consolidate": False}
    )
    run(DatagenConfig.model_validate(datagen), show_progress=False)
    tiny = yaml.safe_load((CONFIG_DIR / "train" / "tiny.yaml").read_text())
    tiny.update(
        dataset_path=str(root / "data"),
        model_name_or_path=str(root / "base"),
        output_dir=str(root / "run"),
        eval_strategy="no",
        save_strategy="no",
        report_to=["none"],
    )
    tiny["tiny_base"]["tokenizer"] = str(shared_data("qwen3-tokenizer"))
    (root / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    assert train(["--config", str(root / "tiny.yaml")]) == 0
    assert export_run(["--run", str(root / "run"), "--out", str(root / "merged"), "--merge"]) == 0
    adapter = {k: v for k, v in tiny.items() if k != "tiny_base"}
    adapter.update(
        model_name_or_path=str(root / "merged"),
        output_dir=str(root / "adapter-run"),
        lora_modules_to_save=None,
        lora_r=8,
        lora_alpha=16,
        max_steps=8,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        warmup_steps=0,
    )
    (root / "adapter.yaml").write_text(yaml.safe_dump(adapter))
    assert train(["--config", str(root / "adapter.yaml")]) == 0
    assert export_run(["--run", str(root / "adapter-run"), "--out", str(root / "adapter")]) == 0
    return {
        "merged": root / "merged",
        "adapter": root / "adapter",
        "data": root / "data",
        "run": root / "run",
    }
