"""`dimmem windows`: split conversations into overlapping windows and report their prompt sizes.

Defaults per source format come from `configs/windows.yaml` (the paper's W/O per benchmark); flags and
`--set key=value` override it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dimmem.config import Section, WindowConfig, add_set_argument
from dimmem.paths import CONFIG_DIR


class WindowsSettings(Section):
    """configs/windows.yaml: the tokenizer and budget, and window/overlap per source format."""

    tokenizer: str = "Qwen/Qwen3-4B"
    max_tokens: int | None = 4096  # 0 or null: no budget
    formats: dict[str, WindowConfig] = {}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", default=str(CONFIG_DIR / "windows.yaml"), help="YAML with defaults (flags override)"
    )
    add_set_argument(p, "formats.locomo.window=30")
    p.add_argument("--format", required=True, help="locomo | longmemeval | chat_jsonl | memorybank")
    p.add_argument("--input", required=True, help="input file")
    p.add_argument("--window", type=int, help="turns per window (W)")
    p.add_argument("--overlap", type=int, help="context turns repeated from the previous window (O)")
    p.add_argument("--max-tokens", type=int, help="budget for the rendered extract prompt; 0 disables it")
    p.add_argument("--tokenizer", help="tokenizer name or folder (default: the target model's)")
    p.add_argument("--out", help="write one JSON line per window here")
    p.add_argument("--stats-json", help="also write the statistics as JSON here")


def window_config(args: argparse.Namespace) -> WindowConfig:
    """The settings for this run: the format's preset, overridden by the flags."""
    from dimmem.config import ConfigError, load_config, validate_config

    settings = load_config(WindowsSettings, args.config, args.overrides)
    preset = settings.formats.get(args.format)
    window = args.window if args.window is not None else preset.window if preset else None
    overlap = args.overlap if args.overlap is not None else preset.overlap if preset else None
    if window is None or overlap is None:
        raise ConfigError(
            f"{args.config}: no window/overlap preset for format {args.format!r}: pass --window and --overlap"
        )
    budget = settings.max_tokens if args.max_tokens is None else args.max_tokens
    return validate_config(
        WindowConfig,
        {
            "window": window,
            "overlap": overlap,
            "max_tokens": budget or None,
            "tokenizer": args.tokenizer or settings.tokenizer,
        },
        f"{args.config} with the flags",
    )


def run(args: argparse.Namespace) -> int:
    from dimmem.contract.loaders import load_conversations
    from dimmem.contract.prompts import extract_prompt_counter, load_prompt
    from dimmem.contract.window_stats import format_stats, window_stats
    from dimmem.contract.windows import window_conversations
    from dimmem.paths import write_json
    from dimmem.progress import progress

    cfg = window_config(args)
    conversations = load_conversations(
        args.format, args.input
    )  # bad input fails before the slow tokenizer load
    template = load_prompt("extract")
    windows = window_conversations(
        progress(conversations, desc="windowing", unit="conv"),
        cfg.window,
        cfg.overlap,
        cfg.max_tokens,
        extract_prompt_counter(cfg.tokenizer, template),
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as out:
            for w in windows:
                out.write(
                    json.dumps(
                        {
                            "conversation_id": w.conversation_id,
                            "window_id": w.id,
                            "window_index": w.index,
                            "context_turns": [t.id for t in w.context],
                            "new_turns": [t.id for t in w.new],
                            "prompt_tokens": w.prompt_tokens,
                            "oversized": w.oversized,
                            "prompt_version": template.id,
                        }
                    )
                    + "\n"
                )
    stats = window_stats(windows, len(conversations))
    stats.update(
        format=args.format,
        window=cfg.window,
        overlap=cfg.overlap,
        max_tokens=cfg.max_tokens,
        prompt_version=template.id,
    )
    print(
        f"{args.format} {Path(args.input).name}: W={cfg.window} O={cfg.overlap} "
        f"budget={cfg.max_tokens or 'none'} prompt={template.id}"
    )
    print(format_stats(stats))
    print("partition: every turn is new in exactly one window (checked)")
    if args.stats_json:
        write_json(args.stats_json, stats)
    return 0
