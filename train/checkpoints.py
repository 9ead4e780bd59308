"""A run's checkpoints: which are saved, which is best, and a mirror that outlives the machine.

After every save, the run's newest checkpoint (adapter, optimizer,
scheduler, RNG and trainer state: all a resume needs) and the adapter of its best one so far (lowest
validation loss) are copied into a folder that is kept, e.g. committed with the repository. A run that
starts on a fresh machine with `resume: latest` first puts the mirrored checkpoints back into its output
folder, then goes on from the newest one as if it had never stopped.

A CPU epoch of the real-dialogue student takes longer than a working session on two cores; its mirror is
what the next session resumes from (configs/train/qwen25-coder-0.5b-locomo.yaml).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from transformers import TrainerCallback

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# what an export of the best checkpoint reads: the adapter and the log that says its validation loss
BEST_FILES = (*ADAPTER_FILES, "trainer_state.json")


def checkpoint_steps(folder: Path) -> list[int]:
    return sorted(int(p.name[11:]) for p in folder.glob("checkpoint-*") if p.name[11:].isdigit())


def best_step(run: Path) -> int | None:
    """The saved checkpoint of lowest validation loss, by the newest checkpoint's log (a later one of
    the same loss wins); None when none has one."""
    saved = checkpoint_steps(run)
    state = run / f"checkpoint-{saved[-1]}" / "trainer_state.json" if saved else None
    history = json.loads(state.read_text()).get("log_history", []) if state and state.is_file() else []
    losses = {row["step"]: row["eval_loss"] for row in history if "eval_loss" in row and row["step"] in saved}
    return min(losses, key=lambda step: (losses[step], -step)) if losses else None


def mirror_run(run: Path, mirror: Path) -> list[str]:
    """Make `mirror` hold the run's newest checkpoint in full and its best one's adapter (when another);
    written beside and swapped in whole, so a kill mid-copy leaves the previous mirror as it was."""
    steps = checkpoint_steps(run)
    if not steps:
        return []
    newest = steps[-1]
    best = best_step(run)
    staging = mirror.with_name(mirror.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copytree(run / f"checkpoint-{newest}", staging / f"checkpoint-{newest}")
    if best is not None and best != newest:
        (staging / f"checkpoint-{best}").mkdir()
        for name in BEST_FILES:
            shutil.copy2(run / f"checkpoint-{best}" / name, staging / f"checkpoint-{best}" / name)
    previous = mirror.with_name(mirror.name + ".previous")
    shutil.rmtree(previous, ignore_errors=True)
    if mirror.exists():
        mirror.rename(previous)
    staging.rename(mirror)
    shutil.rmtree(previous, ignore_errors=True)
    return sorted(p.name for p in mirror.iterdir())


def restore_run(mirror: Path, run: Path) -> list[str]:
    """Copy the mirror's checkpoints the run folder lacks back into it (none are overwritten: a newer
    local run wins, as `resume: latest` takes the newest checkpoint either way)."""
    if not mirror.is_dir():  # killed between the two renames of mirror_run: the previous one is whole
        mirror = mirror.with_name(mirror.name + ".previous")
    restored = []
    for step in checkpoint_steps(mirror) if mirror.is_dir() else []:
        name = f"checkpoint-{step}"
        if not (run / name).exists():
            shutil.copytree(mirror / name, run / name)
            restored.append(name)
    if restored:
        print(f"restored {', '.join(restored)} from {mirror} into {run}", file=sys.stderr)
    return restored


class MirrorCallback(TrainerCallback):
    """Mirrors the run after each checkpoint is written (the main process only)."""

    def __init__(self, mirror: Path):
        self.mirror = mirror

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        try:
            kept = mirror_run(Path(args.output_dir), self.mirror)
        except OSError as exc:  # a full disk or a read-only mirror costs the mirror, not the run
            print(f"could not mirror {args.output_dir} into {self.mirror}: {exc}", file=sys.stderr)
            return
        print(f"mirrored {', '.join(kept)} into {self.mirror}", file=sys.stderr)
