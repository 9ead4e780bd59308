"""`python -m train --config configs/train/NAME.yaml [--flag value ...]`, also under
`accelerate launch -m train`."""

import sys

from dimmem.errors import run_command


def main(argv: list[str] | None = None) -> int:
    def train_run() -> int:
        from train.args import parse_args
        from train.sft import train

        train(*parse_args(argv))
        return 0

    return run_command("train", train_run)


if __name__ == "__main__":
    sys.exit(main())
