"""How a command fails: one line that says what is wrong and where, exit status 2, no traceback.

Bad input is a ValueError (a malformed file, a config mistake, a refused argument), a missing file an
OSError, a model endpoint that gives no answer a `DimmemError` (`dimmem.llm.ModelError`), a Hub push
that cannot go through a `DimmemError` from `hub_push` that says how to push the finished folder later;
anything else is a bug and keeps its traceback.
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


def hub_push(push: Callable[[], str], folder, retry: str) -> str:
    """`push()` (an upload to the Hugging Face Hub that returns the URL), with everything that keeps it
    from working said in one line: no token, a token the Hub rejects, no network (or offline mode), or
    another refusal. The line names the finished folder and `retry`, the command that pushes it later
    without redoing the work. Raises DimmemError (exit status 2)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub import errors as hub_errors

    endpoint = constants.ENDPOINT

    def failed(problem: str) -> DimmemError:
        return DimmemError(
            f"push failed: {problem}; {folder} is complete and kept: push it later with `{retry}`"
        )

    if not huggingface_hub.get_token():
        raise failed("no Hugging Face token (run `hf auth login` or set HF_TOKEN)")
    try:
        return push()
    except hub_errors.OfflineModeIsEnabled:
        raise failed("HF_HUB_OFFLINE is set (unset it to push)") from None
    except hub_errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if status in (401, 403):
            raise failed(f"{endpoint} rejected the token ({status}: {first})") from None
        raise failed(f"{endpoint} refused the upload ({first})") from None
    except hub_errors.HFValidationError as exc:
        raise failed(f"invalid repo id: {exc}") from None
    except (ConnectionError, TimeoutError, *_transport_errors()) as exc:
        raise failed(f"cannot reach {endpoint} ({type(exc).__name__}: {exc})") from None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection errors of the HTTP clients huggingface_hub and datasets use (those not OSErrors)."""
    found = []
    for module, name in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "RequestException"),
    ):
        try:
            found.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)
