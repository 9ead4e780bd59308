"""Tri-path retrieval: BM25 (the store's lexical index), dense (MiniLM cosine, `Store.dense`) and
dimension match (type, time overlap, location, keywords), fused by reciprocal rank fusion. A query that
states a time ranks records whose time overlaps it above records dated elsewhere; each hit keeps its rank
and score on every path."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dimmem.contract.records import MEMORY_TYPES
from dimmem.contract.timespan import overlaps, parse_span
from dimmem.runtime.stores.base import Store

RRF_K = 60  # the constant of reciprocal rank fusion (Cormack et al., 2009)
CANDIDATES_PER_DEPTH = 4
_WORD = re.compile(r"[^\W_]+")  # word tokens of content, matched against the query's keywords


@dataclass
class Hit:
    record: dict
    score: float
    paths: dict[str, dict] = field(default_factory=dict)  # path -> {"rank": r, "score": s}


def dimension_score(record: dict, query: dict) -> float:
    """How well a record's dimensions match the parsed query (0 when nothing matches)."""
    score = 0.0
    if record["type"] in query.get("target_types", []):
        score += 0.5
    if (
        query.get("time")
        and record.get("time")
        and overlaps(parse_span(query["time"]), parse_span(record["time"]))
    ):
        score += 2.0
    location = (query.get("location") or "").casefold()
    if location and location in (record.get("location") or "").casefold():
        score += 1.0
    wanted = {k.casefold() for k in query.get("keywords", [])}
    if wanted:
        have = {k.casefold() for k in record["keywords"]} | set(_WORD.findall(record["content"].casefold()))
        score += len(wanted & have) / len(wanted)
    return score


def dimension_path(store: Store, user_id: str, query: dict, depth: int) -> list[tuple[str, float]]:
    """Candidates by index (most shared keywords, overlapping time), ranked by dimension score. Each
    lookup is bounded (`CANDIDATES_PER_DEPTH` x depth), so a large store costs no more than a small one.
    The query's types weigh in the score but do not filter: a mistyped query or record still scores."""
    ids: dict[str, None] = {}
    limit = CANDIDATES_PER_DEPTH * depth
    ids.update(dict.fromkeys(store.candidates(user_id, list(MEMORY_TYPES), query.get("keywords", []), limit)))
    if query.get("time"):
        start, end = parse_span(query["time"])
        ids.update(dict.fromkeys(store.records_in_span(user_id, start.isoformat(), end.isoformat(), limit)))
    records = store.get_many(user_id, list(ids))
    scored = [(rid, s) for rid, record in records.items() if (s := dimension_score(record, query)) > 0]
    return sorted(scored, key=lambda x: (-x[1], x[0]))[:depth]


def rrf(
    paths: dict[str, list[tuple[str, float]]], weights: dict[str, float] | None = None
) -> list[tuple[str, float, dict]]:
    """(Weighted) reciprocal rank fusion: (id, fused score, {path: {rank, score}}), best first."""
    fused: dict[str, list] = {}
    for name, ranked in paths.items():
        weight = 1.0 if weights is None else weights.get(name, 0.0)
        for rank, (rid, score) in enumerate(ranked, start=1):
            entry = fused.setdefault(rid, [0.0, {}])
            entry[0] += weight / (RRF_K + rank)
            entry[1][name] = {"rank": rank, "score": round(score, 6)}
    return sorted(
        ((rid, score, per_path) for rid, (score, per_path) in fused.items()), key=lambda x: (-x[1], x[0])
    )


def fuse(
    store: Store,
    user_id: str,
    paths: dict[str, list[tuple[str, float]]],
    query: dict,
    k: int,
    weights: dict[str, float] | None = None,
) -> list[Hit]:
    """The top `k` of RRF, records dated outside the query's time (if it states one) after the rest, each
    group in RRF order. Records are read a few more than `k` at a time, in fused order, only until `k`
    are known to come first: a search reads about `k` records, not every candidate of every path."""
    fused = rrf(paths, weights)
    span = parse_span(query["time"]) if query.get("time") else None
    first, dated_elsewhere = [], []
    step = max(2 * k, 20)
    for start in range(0, len(fused), step):
        chunk = fused[start : start + step]
        records = store.get_many(user_id, [rid for rid, _, _ in chunk])
        for rid, score, per_path in chunk:
            if rid in records:  # (removed since the paths ranked it: skipped)
                record = records[rid]
                elsewhere = span and record.get("time") and not overlaps(span, parse_span(record["time"]))
                (dated_elsewhere if elsewhere else first).append(Hit(record, score, per_path))
        if len(first) >= k:
            break
    return (first + dated_elsewhere)[:k]
