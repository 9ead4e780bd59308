"""A training profile cut to a CI-sized run: the same code path, a few steps, exported merged."""

from __future__ import annotations

from pathlib import Path

import yaml

CI_SIZED = {  # few steps at a constant rate; no evaluation, checkpoints or reports
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "eval_strategy": "no",
    "save_strategy": "no",
    "report_to": ["none"],
}


def train_and_export(root: Path, profile: Path, dataset: Path, **overrides) -> Path:
    """Train `profile` on `dataset` with its base written at root/base, the run at root/run and the merged
    export at root/export (returned)."""
    from train.__main__ import main as train
    from train.export import main as export_run

    raw = yaml.safe_load(profile.read_text())
    raw.update(
        dataset_path=str(dataset),
        model_name_or_path=str(root / "base"),
        output_dir=str(root / "run"),
        checkpoint_mirror=str(root / "mirror"),  # never the repository's committed one
        **CI_SIZED,
        **overrides,
    )
    (root / "profile.yaml").write_text(yaml.safe_dump(raw))
    assert train(["--config", str(root / "profile.yaml")]) == 0
    assert export_run(["--run", str(root / "run"), "--out", str(root / "export"), "--merge"]) == 0
    return root / "export"
