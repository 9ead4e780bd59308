"""A small pipeline run to look at, without a trained model: the toy world labeled by its oracle, two
eval runs scored against its test split (the teacher's own answers, and a perturbed copy), and a memory
store loaded from its labels with the conversations' turns and one record edited.

    python -m devtools.sample_run OUT      # prints the `dimmem inspect ...` command that opens it

The screenshots (`python -m devtools.screenshots`) and the browser tests are made over these."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from dimmem.paths import CONFIG_DIR

INVENTED = "Zed flew a kite on the moon."


def datagen_output(out: Path, conversations: int = 12):
    """The toy datagen config (configs/datagen/toy.yaml), smaller, labeled into `out`; returns the config."""
    from data_gen.config import DatagenConfig
    from data_gen.run import run
    from dimmem.config import load_config

    cfg = load_config(
        DatagenConfig,
        CONFIG_DIR / "datagen" / "toy.yaml",
        {"out": str(out), "source.conversations": conversations},
    )
    run(cfg, show_progress=False)
    return cfg


def eval_run(datagen_out: str | Path, out: Path, change: Callable[[dict], str]) -> None:
    """An eval run of the test split from stored predictions: each reference answer through `change`."""
    from eval.extraction import Prediction, evaluate, load_references

    spec = f"{datagen_out}:test"
    refs = load_references(spec)
    predictions = {r.window_id: Prediction(r.window_id, change(json.loads(r.answer))) for r in refs}
    run_info = {"name": out.name, "references": spec, "source": "predictions", "model": out.name}
    evaluate(refs, predictions, out, run_info, None)


def perturbed(answer: dict) -> str:
    """The first record retyped and redated, the last of several dropped, one never said added."""
    memories = [dict(m) for m in answer["memories"]]
    if memories:
        memories[0].update(type="plan", time="2020-01-01")
    if len(memories) > 1:
        memories.pop()
    invented = {**(memories or [{}])[0], "content": INVENTED}
    return json.dumps({"memories": [*memories, invented]})


def memory_store(cfg, path: Path) -> dict:
    """The labels' records with their conversations' turns, each conversation its own user; the first
    record of the user with the most records edited (a second version). Returns that user and record."""
    from data_gen.run import load_source
    from dimmem.runtime.labels import label_memories
    from dimmem.runtime.memory import Memory

    conversations = {c.id: c for c in load_source(cfg)[0]}
    by_user = label_memories(Path(cfg.out) / "labels.jsonl")
    memory = Memory({"store": str(path)})
    try:
        for user, records in by_user.items():
            memory.add_records(records, user_id=user, conversation=conversations[user], consolidate=False)
        user = max(by_user, key=lambda u: len(by_user[u]))
        first = memory.get_all(user_id=user).memories[0]
        memory.update(first["id"], user_id=user, content=first["content"] + " Really.")
    finally:
        memory.close()
    return {"user": user, "edited": first}


def build(root: Path) -> tuple[list[str], dict]:
    """Everything, under `root`: the paths to give `dimmem inspect`, and the store's edited record."""
    cfg = datagen_output(root / "datagen")
    eval_run(cfg.out, root / "eval-teacher", json.dumps)
    eval_run(cfg.out, root / "eval-perturbed", perturbed)
    (root / "memory.sqlite").unlink(missing_ok=True)
    edited = memory_store(cfg, root / "memory.sqlite")
    return [
        cfg.out,
        str(root / "eval-teacher"),
        str(root / "eval-perturbed"),
        str(root / "memory.sqlite"),
    ], edited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder to write the sample run into")
    paths, _ = build(Path(parser.parse_args(argv).out))
    print("dimmem inspect " + " ".join(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
