"""The loss curve of a run, as a PNG next to its checkpoints."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_losses(log_history: list[dict], out: str | Path, title: str) -> Path | None:
    train = [(h["step"], h["loss"]) for h in log_history if "loss" in h]
    evals = [(h["step"], h["eval_loss"]) for h in log_history if "eval_loss" in h]
    if not train and not evals:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for points, label, style in ((train, "train", "-"), (evals, "validation", "o--")):
        if points:
            ax.plot(*zip(*points), style, label=label)
    ax.set(xlabel="step", ylabel="loss (answer tokens)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)
