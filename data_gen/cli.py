"""`dimmem datagen` / `python -m data_gen`: label windows with a teacher and build the SFT dataset."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dimmem.config import add_set_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="configs/datagen/NAME.yaml (required, except with --push-only)")
    add_set_argument(p, "teacher.rpm=100")
    p.add_argument(
        "--format", help="source format: locomo, longmemeval, chat_jsonl, memorybank, hf_messages, toy"
    )
    p.add_argument("--input", help="source file (or dataset folder / Hub name for hf_messages)")
    p.add_argument("--out", help="output folder (cache, dataset, report, card)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    p.add_argument("--model", help="teacher model name")
    p.add_argument("--teacher", choices=["openai", "oracle"], help="oracle: toy-world ground truth, no LLM")
    p.add_argument("--concurrency", type=int, help="requests in flight")
    p.add_argument("--window", type=int)
    p.add_argument("--overlap", type=int)
    p.add_argument("--max-tokens", type=int, help="prompt token budget per window")
    p.add_argument("--tokenizer", help="tokenizer for the budget (default: the target model's)")
    p.add_argument("--limit", type=int, help="at most this many jobs per task (smoke runs)")
    p.add_argument("--batch", action="store_true", default=None, help="use the OpenAI Batch API")
    p.add_argument(
        "--retry-quarantined", action="store_true", default=None, help="send quarantined jobs again"
    )
    p.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="push dataset and card to this Hub dataset repo; if the push fails (no network, no or a "
        "rejected token) the outputs stay complete, the command exits 2 and prints the --push-only command",
    )
    p.add_argument(
        "--push-only",
        metavar="FOLDER",
        help="push a finished datagen output folder to --push-to-hub REPO, without labeling again",
    )
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from data_gen.config import FLAGS, DatagenConfig
    from data_gen.run import run as run_datagen
    from dimmem.config import ConfigError, load_config
    from dimmem.llm import FatalModelError
    from dimmem.paths import dataset_folder

    if args.push_only:
        if not args.push_to_hub or args.config:
            raise ConfigError("--push-only FOLDER takes --push-to-hub REPO (and no --config)")
        folder = Path(args.push_only)
        dataset_folder(folder)  # a datagen output, or FileNotFoundError naming the folder
        print(f"pushed to {push_checked(folder, args)}")
        return 0
    if not args.config:
        raise ConfigError("--config is required (or --push-only FOLDER --push-to-hub REPO)")
    if args.push_to_hub:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:  # a bad name fails before labeling, not after it
            validate_repo_id(args.push_to_hub)
        except HFValidationError as exc:
            raise ConfigError(f"--push-to-hub {args.push_to_hub}: {exc}") from None
    flags = {key: getattr(args, flag) for flag, key in FLAGS.items()}
    cfg = load_config(DatagenConfig, args.config, args.overrides, flags=flags)
    try:
        report = run_datagen(cfg, show_progress=not args.quiet)
    except FatalModelError as exc:
        print(
            f"dimmem datagen: stopped: {exc} (responses stored so far are kept; re-run to resume)",
            file=sys.stderr,
        )
        return 3
    print(json.dumps(report, indent=2))
    if args.push_to_hub:
        print(f"pushed to {push_checked(Path(cfg.out), args)}")
    return 0


def push_checked(folder: Path, args: argparse.Namespace) -> str:
    """The dataset and card pushed, or one line that gives the command to push this folder later."""
    import shlex

    from data_gen.dataset import push_to_hub
    from dimmem.errors import hub_push

    def push() -> str:
        push_to_hub(folder, args.push_to_hub, args.private)
        return f"https://huggingface.co/datasets/{args.push_to_hub}"

    retry = (
        f"dimmem datagen --push-only {shlex.quote(str(folder.resolve()))} --push-to-hub {args.push_to_hub}"
    )
    return hub_push(push, folder.resolve(), retry + (" --private" if args.private else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_gen", description=__doc__)
    add_arguments(parser)
    from dimmem.errors import run_command

    return run_command("datagen", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
