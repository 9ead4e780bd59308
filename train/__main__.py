"""`python -m train --config configs/train/NAME.yaml [--flag value ...]`, also under `accelerate launch -m train`."""
import sys

from train.args import parse_args
from train.sft import train


def main(argv: list[str] | None = None) -> int:
    train(*parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
