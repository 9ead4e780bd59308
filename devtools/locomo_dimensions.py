"""Writes `dimmem/contract/data/locomo-dimensions.jsonl` from readings of LoCoMo's annotations.

A reading is a JSONL file per conversation, one line per annotation in the order
`python -m devtools.locomo_dimensions --items DIR` lists them (each with its evidence turns and their
neighbours, to be read by a person or a large model under docs/locomo-dimensions.md):
`{"id": "conv-26/S10/obs/0", "time": ..., "time_expression": ..., "location": ..., "reason": ...,
"purpose": ...}`. The shipped file keys each row by the annotation's place in locomo10.json (session key,
person, index) and a hash of its text, so it carries no LoCoMo text of its own.

    python -m devtools.locomo_dimensions --items runs/dimensions/items        # what there is to read
    python -m devtools.locomo_dimensions --readings runs/dimensions/readings  # the shipped file
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_gen.annotations import place
from dimmem.contract.annotations import DIMENSION_KEYS, DIMENSIONS_FILE, content_sha, conversation_gold
from dimmem.contract.conversation import Conversation
from dimmem.contract.loaders.locomo import load_locomo
from dimmem.contract.prompts import human_date
from dimmem.contract.timespan import parse_span
from dimmem.paths import shared_data


def readable(conv: Conversation):
    """(gold, turns it cites) for every observation with evidence and every event the annotations
    teacher places at a turn: what a label of this conversation can carry dimensions for."""
    placed, _ = place(conv)
    items = [(g, g.evidence) for g in conversation_gold(conv).observations if g.evidence]
    return items + [(p.gold, p.cites) for p in placed if p.kind == "event"]


def write_items(conv: Conversation, path: Path) -> None:
    """The items to read: each annotation, its session date, its evidence turns (*) and their neighbours."""
    order = {t.id: i for i, t in enumerate(conv.turns)}
    turns = conv.turns
    lines = [f"# {conv.id}\n"]
    for gold, cites in readable(conv):
        shown = sorted(
            {
                j
                for i in (order[c] for c in cites)
                for j in (i - 1, i, i + 1)
                if 0 <= j < len(turns) and turns[j].session_id == turns[i].session_id
            }
        )
        lines += [
            f"### {gold.id}",
            f"person: {gold.person} | session date: {human_date(turns[order[cites[0]]].session_time)}",
            f"{'observation' if '/obs/' in gold.id else 'event'}: {gold.content}",
            *(
                f"  {'*' if turns[j].id in cites else ' '} {turns[j].id} {turns[j].speaker}: {turns[j].text}"
                for j in shown
            ),
            "",
        ]
    path.write_text("\n".join(lines), encoding="utf-8")


def shipped_rows(conv: Conversation, reading: Path) -> list[dict]:
    """The reading of one conversation as rows of the shipped file; every annotation read exactly once."""
    golds = {g.id: g for g, _ in readable(conv)}
    rows, seen = [], set()
    for number, line in enumerate(reading.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        read = json.loads(line)
        gold = golds.get(read["id"])
        if gold is None or read["id"] in seen:
            raise ValueError(
                f"{reading}: line {number}: {read['id']!r} is not an unread annotation of {conv.id}"
            )
        if read["time"] is not None:
            parse_span(read["time"])  # raises, naming the value
        seen.add(read["id"])
        key, person, index = gold.path
        rows.append(
            {
                "conversation": conv.id,
                "key": key,
                "person": person,
                "index": index,
                "content_sha": content_sha(gold.content),
                **{k: read[k] for k in DIMENSION_KEYS},
                "time_expression": read["time_expression"],
            }
        )
    if missing := sorted(set(golds) - seen):
        raise ValueError(
            f"{reading}: {len(missing)} annotations of {conv.id} not read (first: {missing[:3]})"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.locomo_dimensions", description=__doc__)
    parser.add_argument("--input", default=str(shared_data("locomo/locomo10.json")))
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--items", help="write DIR/<conversation>.md, the annotations to read")
    group.add_argument("--readings", help="DIR of <conversation>.jsonl readings -> the shipped file")
    args = parser.parse_args(argv)
    conversations = load_locomo(args.input)
    if args.items:
        folder = Path(args.items)
        folder.mkdir(parents=True, exist_ok=True)
        for conv in conversations:
            write_items(conv, folder / f"{conv.id}.md")
        return 0
    rows = []
    for conv in conversations:
        reading = Path(args.readings) / f"{conv.id}.jsonl"
        if reading.is_file():
            rows += shipped_rows(conv, reading)
    DIMENSIONS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(DIMENSIONS_FILE, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    print(f"{len(rows)} annotations read -> {DIMENSIONS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
