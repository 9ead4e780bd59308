"""Summary statistics of a set of windows, as `dimmem windows` prints them."""

from __future__ import annotations

import numpy as np

from dimmem.contract.windows import Window


def window_stats(windows: list[Window], conversations: int) -> dict:
    tokens = np.array([w.prompt_tokens or 0 for w in windows])
    new = np.array([len(w.new) for w in windows])
    total = np.array([len(w.turns) for w in windows])
    return {
        "conversations": conversations,
        "windows": len(windows),
        "turns": int(new.sum()),
        "prompt_tokens": {
            "p50": int(np.percentile(tokens, 50)),
            "p95": int(np.percentile(tokens, 95)),
            "max": int(tokens.max()),
        },
        "new_turns_per_window": {
            "mean": round(float(new.mean()), 2),
            "min": int(new.min()),
            "max": int(new.max()),
        },
        "turns_per_window": {
            "mean": round(float(total.mean()), 2),
            "min": int(total.min()),
            "max": int(total.max()),
        },
        "oversized": int(sum(w.oversized for w in windows)),
    }


def format_stats(stats: dict) -> str:
    pt, nt, tt = stats["prompt_tokens"], stats["new_turns_per_window"], stats["turns_per_window"]
    lines = [
        f"conversations {stats['conversations']}  windows {stats['windows']}  turns {stats['turns']}",
        f"prompt tokens   p50 {pt['p50']}  p95 {pt['p95']}  max {pt['max']}",
        f"turns/window    mean {tt['mean']}  min {tt['min']}  max {tt['max']}   "
        f"(new: mean {nt['mean']}  min {nt['min']}  max {nt['max']})",
    ]
    if stats["oversized"]:
        lines.append(
            f"WARNING: {stats['oversized']} window(s) hold a single turn longer than the budget "
            "(flagged 'oversized')"
        )
    return "\n".join(lines)
