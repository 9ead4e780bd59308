"""sample.md of a LoCoMo extraction run: records drawn at random, matched and unmatched, each beside the
gold observation it was (or came closest to being) matched with and the turns it cites, so a reader
sees what the numbers mean."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dimmem.contract.annotations import ConversationGold, Gold
from dimmem.contract.conversation import Conversation
from eval.locomo_match import is_about, subject


def _quote(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _closest(record: dict, observations: list[Gold], vectors: Callable) -> tuple[Gold, float] | None:
    if not observations:
        return None
    sims = vectors([g.content for g in observations]) @ vectors([record["content"]])[0]
    best = int(np.argmax(sims))
    return observations[best], float(sims[best])


def _why_unmatched(
    record: dict, gold: Gold, similarity: float, threshold: float, conv: Conversation, taken: bool
) -> str:
    speaker_of = {t.id: t.speaker for t in conv.turns}
    if not is_about(record, gold, conv.speakers, speaker_of):
        about = subject(record, conv.speakers)
        return f"about {about} (speaker {record['speaker']}), the gold about {gold.person}"
    if similarity < threshold:
        return f"cosine {similarity:.3f} below the threshold {threshold:.3f}"
    if taken:
        return "its closest observation went to another record that states it better"
    return "no observation of its session aligned with it"


def write_sample(
    out: Path,
    conversations: list[Conversation],
    golds: dict[str, ConversationGold],
    records: dict[str, list[dict]],
    matches: dict[str, dict[str, tuple[str, float]]],
    vectors: Callable,
    thresholds: dict[str, dict[str, float]],
    n: int,
    seed: int = 0,
) -> Path:
    """`records`/`matches`: per conversation, the kept records and the `fact` alignment (gold -> record)."""
    rng = random.Random(seed)
    by_id = {c.id: c for c in conversations}
    matched, unmatched = [], []
    for cid, kept in records.items():
        to_gold = {rid: (gid, sim) for gid, (rid, sim) in matches.get(cid, {}).items()}
        for r in kept:
            (matched if r["id"] in to_gold else unmatched).append((cid, r, to_gold.get(r["id"])))
    lines = [
        "# A reading sample",
        "",
        f"{min(n, len(matched))} of {len(matched)} matched and {min(n, len(unmatched))} of {len(unmatched)} "
        "unmatched records, drawn at random (seeded), each beside its gold observation (the one it was "
        "matched with, or the closest of its session by cosine) and the turns it cites.",
        "",
    ]
    for title, rows in (("Matched", matched), ("Unmatched", unmatched)):
        lines += [f"## {title}", ""]
        for cid, r, match in rng.sample(rows, min(n, len(rows))):
            conv, gold = by_id[cid], golds[cid]
            turns = {t.id: t for t in conv.turns}
            session = turns[r["source_turns"][0]].session_id
            if match:
                g = next(o for o in gold.observations if o.id == match[0])
                verdict = f"matched, cosine {match[1]:.3f}"
            else:
                closest = _closest(r, [o for o in gold.observations if o.session == session], vectors)
                if closest is None:
                    g, verdict = None, "no gold observation in its session"
                else:
                    g, sim = closest
                    taken = g.id in matches.get(cid, {})
                    threshold = thresholds[cid]["cosine"]
                    verdict = "unmatched: " + _why_unmatched(r, g, sim, threshold, conv, taken)
            dims = ", ".join(f"{k} {r[k]!r}" for k in ("time", "location", "reason", "purpose") if r.get(k))
            lines += [
                f"- **record** ({r['speaker']}, {r['type']}{', ' + dims if dims else ''}): "
                f"{_quote(r['content'])}",
                f"  - **gold** {f'({g.person}, {g.id})' if g else ''}: {_quote(g.content) if g else '-'}; "
                f"{verdict}",
                *(f"  - `{t}` {turns[t].speaker}: {_quote(turns[t].text)}" for t in r["source_turns"]),
            ]
        lines.append("")
    path = out / "sample.md"
    path.write_text("\n".join(lines))
    return path
