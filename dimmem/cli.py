"""The `dimmem` command: one subcommand per stage, each defined in its own package.

Only the command that runs is imported (`dimmem --help` imports none of them), so the command starts at
once whatever the stages need. The stages are found by module name (`COMMANDS`), never imported by
the library: `dimmem` depends on no stage (.importlinter holds it). `dimmem train` is TRL's own parser
(`python -m train`)."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with add_arguments(parser) and run(args), help); `train` is handed to TRL's parser
COMMANDS = {
    "windows": (
        "dimmem.contract.cli",
        "split conversations into overlapping windows and report prompt sizes",
    ),
    "datagen": ("data_gen.cli", "label windows with a teacher model and build the SFT dataset"),
    "train": (
        "train.__main__",
        "LoRA SFT (TRL): --config configs/train/NAME.yaml [--any_sft_field value ...]",
    ),
    "export": ("train.export", "export a run: adapter or merged model, model card, Hub push"),
    "eval": ("eval.cli", "extraction quality, memory QA, retrieval benchmarks"),
    "memory": ("dimmem.runtime.cli", "the memory runtime: add conversations, load extracted records, search"),
    "serve": ("serve.cli", "vLLM for the extractor, the HTTP memory service, the MCP server"),
    "inspect": ("inspector.cli", "a local web inspector over datagen outputs, eval runs and memory stores"),
}


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error said in one line (`dimmem eval extraction: error: ...`) and exit
    status 2 like every other failure; `--help` shows the usage. Subcommand parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the flags of `command` only (the others are listed by name and help)."""
    parser = Parser(prog="dimmem", description="DimMem compact memory extractor pipeline")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from dimmem.errors import run_command

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # TRL's parser takes the whole command line
        return importlib.import_module(COMMANDS["train"][0]).main(argv[1:])
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return run_command(args.command, module.run, args)


if __name__ == "__main__":
    sys.exit(main())
