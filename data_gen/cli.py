"""`dimmem datagen` / `python -m data_gen`: label windows with a teacher and build the SFT dataset;
`import` / `export` the DimMem authors' SFT rows; `check-overlap` a training set against a benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dimmem.config import add_set_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    from data_gen.config import TEACHER_KINDS  # here: `dimmem --help` imports no stage's config

    p.add_argument("--config", help="configs/datagen/NAME.yaml (required, except with --push-only)")
    add_set_argument(p, "teacher.rpm=100")
    p.add_argument(
        "--format", help="source format: locomo, longmemeval, chat_jsonl, memorybank, hf_messages, toy"
    )
    p.add_argument("--input", help="source file (or dataset folder / Hub name for hf_messages)")
    p.add_argument("--out", help="output folder (cache, dataset, report, card)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    p.add_argument("--model", help="teacher model name")
    p.add_argument(
        "--teacher",
        choices=TEACHER_KINDS,
        help="openai: any OpenAI-compatible endpoint; oracle: the toy world's ground truth; annotations: the "
        "corpus's own annotations (LoCoMo); neither of the last two calls a model",
    )
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
    _paper_commands(p)


def _paper_commands(p: argparse.ArgumentParser) -> None:
    from dimmem.contract.paper_format import FORMATS

    paper_formats = list(FORMATS)
    sub = p.add_subparsers(dest="datagen_command", metavar="{import,export,check-overlap}")
    i = sub.add_parser(
        "import",
        help="the DimMem authors' SFT rows -> a dataset folder (labels validated, split by template)",
    )
    i.add_argument(
        "source", help="Hub dataset id, a local folder laid out as the Hub's, or a JSON/JSONL file"
    )
    i.add_argument("--out", dest="sub_out", required=True, help="output folder (as `dimmem datagen` writes)")
    i.add_argument(
        "--format",
        dest="sub_format",
        choices=["auto", *paper_formats],
        default="auto",
        help="their variant (auto: dimmem-paper-longmemeval when every line is `User`)",
    )
    i.add_argument("--teacher-model", help="the model that wrote the labels, for the card (e.g. gpt-5.4)")
    i.add_argument("--license", help="the source's license, for the card (default: what the dataset states)")
    i.add_argument("--validation", type=float, default=0.1, help="share of templates held out for validation")
    i.add_argument("--test", type=float, default=0.1, help="share of templates held out for test")
    i.add_argument("--seed", type=int, default=0, help="seed of the split")
    i.add_argument("--quiet", dest="sub_quiet", action="store_true", help="no progress bar")
    e = sub.add_parser("export", help="a datagen output's labels as the DimMem authors' SFT rows")
    e.add_argument("folder", help="a datagen output folder (its jobs.jsonl)")
    e.add_argument("--format", dest="sub_format", choices=paper_formats, required=True)
    e.add_argument("--out", dest="sub_out", required=True, help="folder for <split>.jsonl and report.json")
    c = sub.add_parser(
        "check-overlap", help="how much of an evaluation benchmark's conversations a training set shares"
    )
    c.add_argument("--train", required=True, help="a datagen output folder, or rows in the authors' layout")
    c.add_argument("--eval", required=True, help="the benchmark's source format, e.g. locomo, longmemeval")
    c.add_argument("--eval-input", help="its file (default for locomo: the shared data's locomo10.json)")
    c.add_argument("--out", dest="sub_out", help="write the result as JSON here")


def run_paper_command(args: argparse.Namespace) -> int:
    from data_gen.config import SplitConfig
    from dimmem.config import validate_config

    if args.datagen_command == "import":
        from data_gen.paper_dataset import import_paper

        split = {"validation": args.validation, "test": args.test, "seed": args.seed}
        split = validate_config(SplitConfig, split, "datagen import")
        report = import_paper(
            args.source,
            Path(args.sub_out),
            split,
            args.sub_format,
            args.teacher_model,
            args.license,
            show_progress=not (args.quiet or args.sub_quiet),
        )
        print(json.dumps(report, indent=2))
        return 0
    if args.datagen_command == "export":
        from data_gen.paper_dataset import export_paper

        print(json.dumps(export_paper(Path(args.folder), Path(args.sub_out), args.sub_format), indent=2))
        return 0
    from data_gen.overlap import as_json, check_overlap, format_report, train_conversations
    from dimmem.contract.loaders import load_conversations
    from dimmem.paths import shared_data, write_json

    if args.eval_input is None and args.eval != "locomo":
        raise ValueError(f"--eval {args.eval} needs --eval-input FILE")
    eval_input = args.eval_input or str(shared_data("locomo/locomo10.json"))
    rows = check_overlap(train_conversations(args.train), load_conversations(args.eval, eval_input))
    print(format_report(rows))
    if args.sub_out:
        write_json(args.sub_out, as_json(rows, args.train, f"{args.eval}:{eval_input}"))
    return 0


def run(args: argparse.Namespace) -> int:
    from data_gen.config import FLAGS, DatagenConfig
    from data_gen.run import run as run_datagen
    from dimmem.config import ConfigError, load_config
    from dimmem.llm import FatalModelError
    from dimmem.paths import dataset_folder

    if args.datagen_command:
        return run_paper_command(args)
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
