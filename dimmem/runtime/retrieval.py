"""Tri-path retrieval: BM25 (the store's lexical index), dense (MiniLM cosine, `Lookup.dense`) and
dimension match (the query's time, place and types), fused by the sum of calibrated scores
(`score_fusion`, the default), by reciprocal rank fusion (`rrf`) or by the DimMem authors' rule
(`dedup`: each path's top k concatenated, duplicates dropped; a baseline). The dimension path votes
only with what the parsed query states. A time the query states ranks, it does not filter: a record
dated elsewhere keeps `TIME_MISS` of its score, so one whose text is what was asked still comes back.
A record no path lifts (fused score 0: the weakest candidate of every path that found it) comes back
only when some path matched it at all: a query term, a stated dimension, or a meaning close to the
question's (`RELATED_COSINE`). Each hit keeps its rank and score on every path."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dimmem.contract.records import MEMORY_TYPES
from dimmem.contract.timespan import overlaps, parse_span
from dimmem.runtime.consolidate import recency, slot
from dimmem.runtime.stores.log import RecordLog

RRF_K = 60  # the constant of reciprocal rank fusion (Cormack et al., 2009)
# what a record dated outside the query's time keeps of its fused score: below a record that matches
# the time about as well otherwise, above one that matches nothing
TIME_MISS = 0.8
# the cosine (MiniLM) from which a record is about the question, where no other path matched it
RELATED_COSINE = 0.3
# a question about the present ("now", "currently"): what the newest of the candidates adds to its score,
# the oldest nothing, the others in proportion to when they were told
RECENT_BONUS = 0.3
CANDIDATES_PER_DEPTH = 4
_WORD = re.compile(r"[^\W_]+")  # word tokens of content, matched against the query's keywords


@dataclass
class Hit:
    record: dict
    score: float
    paths: dict[str, dict] = field(default_factory=dict)  # path -> {"rank": r, "score": s}


# What each matching dimension adds to a record's dimension score (keywords: times the share matched).
DIMENSION_WEIGHTS = {"type": 0.5, "time": 2.0, "location": 1.0, "keywords": 1.0}


def dimension_score(record: dict, query: dict) -> float:
    """How well a record's dimensions match the parsed query (0 when nothing matches)."""
    w = DIMENSION_WEIGHTS
    score = 0.0
    if record["type"] in query.get("target_types", []):
        score += w["type"]
    if _time_matches(record, query):
        score += w["time"]
    if _location_matches(record, query):
        score += w["location"]
    wanted = {k.casefold() for k in query.get("keywords", [])}
    if wanted:
        have = {k.casefold() for k in record["keywords"]} | set(_WORD.findall(record["content"].casefold()))
        score += w["keywords"] * len(wanted & have) / len(wanted)
    return score


def _time_matches(record: dict, query: dict) -> bool:
    return bool(
        query.get("time")
        and record.get("time")
        and overlaps(parse_span(query["time"]), parse_span(record["time"]))
    )


def _location_matches(record: dict, query: dict) -> bool:
    location = (query.get("location") or "").casefold()
    return bool(location) and location in (record.get("location") or "").casefold()


def _stated_types(query: dict) -> set[str]:
    """The memory types the query asks for when it names fewer than all (a choice it made), else none."""
    types = set(query.get("target_types") or MEMORY_TYPES)
    return types if types < set(MEMORY_TYPES) else set()


def dimension_path(store: RecordLog, user_id: str, query: dict, depth: int) -> list[tuple[str, float]]:
    """Records that match a dimension the query states (its time, its place, or its types when it names
    fewer than all), ranked by dimension score as a share of the query's ceiling (in (0, 1]); nothing
    when it states none. A record that shares only keywords is the lexical path's to find: voting for it
    again here would count the same evidence twice. Candidates come by index (most shared keywords,
    overlapping time), each lookup bounded (`CANDIDATES_PER_DEPTH` x depth), so a large store costs no
    more than a small one."""
    types = _stated_types(query)
    if not (query.get("time") or query.get("location") or types):
        return []
    ids: dict[str, None] = {}
    lookup, limit = store.lookup, CANDIDATES_PER_DEPTH * depth
    ids.update(dict.fromkeys(lookup.keywords(user_id, list(MEMORY_TYPES), query.get("keywords", []), limit)))
    if query.get("time"):
        start, end = parse_span(query["time"])
        ids.update(dict.fromkeys(lookup.in_span(user_id, start.isoformat(), end.isoformat(), limit)))
    ceiling = dimension_ceiling(query)
    scored = [
        (rid, dimension_score(record, query) / ceiling)
        for rid, record in store.get_many(user_id, list(ids)).items()
        if _time_matches(record, query) or _location_matches(record, query) or record["type"] in types
    ]
    return sorted(scored, key=lambda x: (-x[1], x[0]))[:depth]


def dimension_ceiling(query: dict) -> float:
    """The best dimension score this query allows (every dimension it states matched)."""
    w = DIMENSION_WEIGHTS
    return (
        w["type"]
        + w["time"] * bool(query.get("time"))
        + w["location"] * bool(query.get("location"))
        + w["keywords"] * bool(query.get("keywords"))
    )


def rrf(
    paths: dict[str, list[tuple[str, float]]], weights: dict[str, float] | None = None
) -> list[tuple[str, float, dict]]:
    """(Weighted) reciprocal rank fusion: (id, fused score, {path: {rank, score}}), best first."""
    return _combine(paths, weights, lambda ranked: [1.0 / (RRF_K + r) for r in range(1, len(ranked) + 1)])


def score_fusion(
    paths: dict[str, list[tuple[str, float]]], weights: dict[str, float] | None = None
) -> list[tuple[str, float, dict]]:
    """(Weighted) sum over the paths of each record's score above the lowest score the path returned for
    this query (a path returning one record gives it its whole score); same shape as `rrf`.

    Every path scores on an absolute scale (BM25 as a share of the query's ceiling, cosine similarity,
    dimension score as a share of the query's ceiling), so what a path adds is how far it lifts a record
    above its own weakest candidate: a path that cannot tell its candidates apart (BM25 matching only a
    name most records share; a dimension path whose candidates all match the same way) adds nearly
    nothing, where RRF gives its first rank as much as any other path's first rank. BENCHMARKS.md
    compares the two on every memory set."""

    def lifts(ranked: list[tuple[str, float]]) -> list[float]:
        floor = ranked[-1][1] if len(ranked) > 1 else 0.0
        return [max(score - floor, 0.0) for _, score in ranked]

    return _combine(paths, weights, lifts)


def _combine(paths, weights, contributions) -> list[tuple[str, float, dict]]:
    """Sum each path's per-record `contributions(ranked)`, weighted; every path's rank and score kept."""
    fused: dict[str, list] = {}
    for name, ranked in paths.items():
        weight = 1.0 if weights is None else weights.get(name, 0.0)
        for rank, ((rid, score), part) in enumerate(zip(ranked, contributions(ranked)), start=1):
            entry = fused.setdefault(rid, [0.0, {}])
            entry[0] += weight * part
            entry[1][name] = {"rank": rank, "score": round(score, 6)}
    return sorted(
        ((rid, score, per_path) for rid, (score, per_path) in fused.items()), key=lambda x: (-x[1], x[0])
    )


DEDUP_ORDER = ("bm25", "dimension", "dense")  # the authors' route order: lexical, structured, dense


def dedup(
    paths: dict[str, list[tuple[str, float]]], weights: dict[str, float] | None, k: int
) -> list[tuple[str, float, dict]]:
    """The DimMem authors' fusion, as a baseline: each path's top `k` concatenated in their order (BM25,
    then the structured route, then dense), a record ranked again dropped; same shape as `rrf`, the
    fused score 1/position. Their structured route is a weighted score of their own; here it is this
    project's dimension path. A path weighted 0 (or left out of `weights`) is left out. Records with the
    same content are dropped by `fuse`, which reads them (`normalized_content`)."""
    names = [*DEDUP_ORDER, *(name for name in paths if name not in DEDUP_ORDER)]
    used = [name for name in names if name in paths and (weights is None or weights.get(name, 0.0))]
    order = dict.fromkeys(rid for name in used for rid, _ in paths[name][:k])
    per_path: dict[str, dict] = {rid: {} for rid in order}
    for name, ranked in paths.items():  # every path's rank and score, as the other fusions keep them
        for rank, (rid, score) in enumerate(ranked, start=1):
            if rid in per_path:
                per_path[rid][name] = {"rank": rank, "score": round(score, 6)}
    return [(rid, 1.0 / position, per_path[rid]) for position, rid in enumerate(order, start=1)]


def normalized_content(text: str) -> str:
    """What makes two contents the same for `dedup`: casefolded, words only (punctuation and underscores
    dropped), single spaces."""
    return " ".join(_WORD.findall(text.casefold()))


FUSIONS = {"score": score_fusion, "rrf": rrf}  # and `dedup`, which takes its own cut (`fuse`)


def fuse(
    store: RecordLog,
    user_id: str,
    paths: dict[str, list[tuple[str, float]]],
    query: dict,
    k: int,
    weights: dict[str, float] | None = None,
    fusion: str = "score",
    dedup_k: int | None = None,
    newest_first: bool = False,
) -> list[Hit]:
    """The top `k` of the fusion (`FUSIONS`; `dedup` cuts each path to its top `dedup_k` and drops a
    record whose `normalized_content` an earlier one has), a record dated outside the query's time (if
    it states one) at `TIME_MISS` of its score, a record of score 0 left out unless some path matched it
    (`_matched`), for every fusion alike;
    `newest_first` (a question about the present): each gets up to `RECENT_BONUS` more by when it was told.
    Records are read a few more than `k` at a time, in fused order, only until no unread one can still
    come first: a search reads about `k` records, not every candidate of every path. `dedup_k`:
    `retrieval.dedup_k`, which fusion `dedup` needs."""
    if fusion == "dedup" and dedup_k is None:
        raise ValueError("fusion 'dedup' needs dedup_k (the config's retrieval.dedup_k)")
    fused = dedup(paths, weights, dedup_k) if fusion == "dedup" else FUSIONS[fusion](paths, weights)
    fused = [e for e in fused if e[1] > 0 or _matched(e[2])]
    seen: set[str] | None = set() if fusion == "dedup" else None  # contents already kept
    span = parse_span(query["time"]) if query.get("time") else None
    hits: list[Hit] = []
    ranked: list[Hit] = []
    step = max(2 * k, 20)
    for start in range(0, len(fused), step):
        chunk = fused[start : start + step]
        records = store.get_many(user_id, [rid for rid, _, _ in chunk])
        for rid, score, per_path in chunk:
            record = records.get(rid)
            if record is not None and record["status"] == "active":  # (removed since it was ranked: skipped)
                if seen is not None:
                    content = normalized_content(record["content"])
                    if content in seen:
                        continue
                    seen.add(content)
                elsewhere = span and record.get("time") and not overlaps(span, parse_span(record["time"]))
                hits.append(Hit(record, score * TIME_MISS if elsewhere else score, per_path))
        ranked = sorted(_newest_first(hits) if newest_first else hits, key=lambda hit: -hit.score)
        unread = fused[start + step][1] if start + step < len(fused) else 0.0
        bound = unread * (1 + RECENT_BONUS) if newest_first else unread
        if len(ranked) >= k and ranked[k - 1].score >= bound:  # no unread record can come above the k-th
            break
    return ranked[:k]


def _matched(per_path: dict[str, dict]) -> bool:
    """Whether any path matched a record at all: a query term (BM25 above 0), a stated dimension (the
    dimension path returns only those), or a meaning close to the question's (cosine `RELATED_COSINE`)."""
    bm25, dense = per_path.get("bm25", {}).get("score", 0.0), per_path.get("dense", {}).get("score", 0.0)
    return bm25 > 0 or per_path.get("dimension", {}).get("score", 0.0) > 0 or dense >= RELATED_COSINE


_PAST = re.compile(
    r"\b(?:used to|lived|grew up|as a (?:kid|child|teen(?:ager)?)|when (?:he|she|they) was)\b", re.I
)


def _newest_first(hits: list[Hit]) -> list[Hit]:
    """The hits as a question about the present ranks them: each with up to `RECENT_BONUS` of its score
    added by when it was told (`recency`: the session's date, else when stored; the newest the whole
    bonus, the oldest none), one that tells the past ("lived", "used to", "as a kid") at `TIME_MISS`, and
    the tellings of one attribute of one person (`consolidate.slot`: where they live, their job) newest
    first, in the places the group's best scores held."""
    told = [recency(hit.record)[0] for hit in hits]
    position = {moment: i / max(len(set(told)) - 1, 1) for i, moment in enumerate(sorted(set(told)))}
    scored = [
        Hit(
            h.record,
            h.score
            * (1 + RECENT_BONUS * position[t])
            * (TIME_MISS if _PAST.search(h.record["content"]) else 1),
            h.paths,
        )
        for h, t in zip(hits, told)
    ]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, hit in enumerate(scored):
        if attribute := slot(hit.record):
            groups.setdefault((hit.record["speaker"].casefold(), attribute[0]), []).append(i)
    for members in groups.values():
        scores = sorted((scored[i].score for i in members), reverse=True)
        newest = sorted(members, key=lambda i: recency(scored[i].record), reverse=True)
        for i, score in zip(newest, scores):
            scored[i] = Hit(scored[i].record, score, scored[i].paths)
    return scored
