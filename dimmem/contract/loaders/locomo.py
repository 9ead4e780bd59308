"""LoCoMo (`locomo10.json`): two named participants, sessions `session_N` dated `session_N_date_time`."""

from __future__ import annotations

import re
from pathlib import Path

from dimmem.contract.annotations import with_dimensions
from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.loaders._fields import Record, read_json

DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y")
_SESSION_KEY = re.compile(r"^session_(\d+)$")


def load_locomo(path: str | Path) -> list[Conversation]:
    data = read_json(path)
    if not isinstance(data, list):
        raise Record(path, "<root>").error("<root>", f"expected a list of samples, got {type(data).__name__}")
    return [_sample(path, index, sample) for index, sample in enumerate(data)]


def _sample(path, index: int, sample) -> Conversation:
    rec = Record(path, index)
    sample_id = rec.get(sample, "sample_id", str, "sample_id")
    rec.record = f"{index} ({sample_id})"
    conv = rec.get(sample, "conversation", dict, "conversation")
    numbers = sorted(int(m.group(1)) for key in conv if (m := _SESSION_KEY.match(key)))
    if not numbers:
        raise rec.error("conversation", "no session_N lists")
    turns: list[Turn] = []
    for number in numbers:
        key = f"session_{number}"
        when = rec.time(
            rec.get(conv, f"{key}_date_time", str, f"conversation.{key}_date_time"),
            f"conversation.{key}_date_time",
            DATE_FORMATS,
        )
        for position, raw in enumerate(rec.get(conv, key, list, f"conversation.{key}")):
            where = f"conversation.{key}[{position}]"
            text = rec.get(raw, "text", str, f"{where}.text")
            caption = rec.get(raw, "blip_caption", str, f"{where}.blip_caption", default=None)
            if caption:  # shared photos carry information the dialogue refers to
                text = f"{text} [shares a photo: {caption}]"
            turns.append(
                Turn(
                    id=rec.get(raw, "dia_id", str, f"{where}.dia_id"),
                    speaker=rec.get(raw, "speaker", str, f"{where}.speaker"),
                    role="participant",
                    text=text,
                    session_id=f"S{number}",
                    session_time=when,
                )
            )
    metadata = {
        key: sample[key] for key in ("qa", "observation", "session_summary", "event_summary") if key in sample
    }
    metadata["source"] = "locomo"
    return Conversation(id=sample_id, turns=turns, metadata=with_dimensions(sample_id, metadata))
