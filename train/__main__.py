"""`python -m train --config configs/train/NAME.yaml [--flag value ...]`, also under `accelerate launch -m train`."""
import sys

from train.args import parse_args
from train.data import DatasetFormatError
from train.sft import TrainConfigError, train


def main(argv: list[str] | None = None) -> int:
    try:
        train(*parse_args(argv))
    except (DatasetFormatError, TrainConfigError) as exc:  # bad data or settings: say what, no traceback
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
