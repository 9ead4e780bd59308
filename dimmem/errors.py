"""How a command fails: one line that says what is wrong and where, exit status 2, no traceback.

Bad input is a ValueError (a malformed file, a config mistake, a refused argument), a missing file an
OSError, a model endpoint that gives no answer a `DimmemError` (`dimmem.llm.ModelError`); anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class DimmemError(Exception):
    """A failure the user can act on, said in one line."""


def run_command(name: str, handler: Callable[..., int], *args) -> int:
    """`handler(*args)`, with the failures users can act on reported as `dimmem NAME: error: ...`."""
    try:
        return handler(*args)
    except (DimmemError, ValueError, OSError) as exc:
        print(f"dimmem {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"dimmem {name}: interrupted (what was stored so far is kept; re-run to resume)", file=sys.stderr
        )
        return 130
