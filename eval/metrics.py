"""Extraction metrics: how well one extractor output matches the reference answer of its window.

Per window: does the output parse as a JSON object, is it schema-valid, which validator rules does it
break, was it cut at max_tokens. Its memories (the objects with a string `content` in `memories`, so a
nearly-right answer still gets credit for what it got right) are aligned one-to-one with the
reference memories by content token F1, maximising total similarity (Hungarian algorithm); pairs at or
above MATCH_THRESHOLD are matches. Matched pairs are scored field by field. `aggregate` sums the
windows (memory precision/recall/F1 are micro-averaged over all memories) and forms the headline.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import numpy as np
from scipy.optimize import linear_sum_assignment

from dimmem.contract.records import DIMENSIONS, MEMORY_TYPES
from dimmem.contract.timespan import overlaps, parse_span
from dimmem.contract.validate import TurnScope, parse_json, validate

MATCH_THRESHOLD = 0.5  # content token F1 at which a predicted memory counts as the reference one
FIELD_SCORES = ("type_accuracy", "time_exact", "keyword_f1", "source_jaccard", "dimension_null_agreement")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def tokens(text: str | None) -> list[str]:
    """Lower case, punctuation and articles removed (the usual QA normalisation)."""
    text = (text or "").lower().translate(str.maketrans("", "", string.punctuation))
    return _ARTICLES.sub(" ", text).split()


def token_f1(a: str | None, b: str | None) -> float:
    ta, tb = tokens(a), tokens(b)
    if not ta and not tb:
        return 1.0
    common = sum((Counter(ta) & Counter(tb)).values())
    if not common:
        return 0.0
    precision, recall = common / len(ta), common / len(tb)
    return 2 * precision * recall / (precision + recall)


def set_f1(a: list, b: list) -> float:
    sa, sb = {str(x).casefold() for x in a or []}, {str(x).casefold() for x in b or []}
    if not sa and not sb:
        return 1.0
    common = len(sa & sb)
    return 2 * common / (len(sa) + len(sb)) if common else 0.0


def jaccard(a: list, b: list) -> float:
    sa, sb = set(a or []), set(b or [])
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def time_overlap(a: str | None, b: str | None) -> bool:
    """Both undated, or both dated with intervals that overlap (an unparseable time overlaps nothing)."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return overlaps(parse_span(a), parse_span(b))
    except ValueError:
        return False


def usable_memories(value: dict | None) -> list[dict]:
    memories = value.get("memories") if isinstance(value, dict) else None
    return (
        [m for m in memories if isinstance(m, dict) and isinstance(m.get("content"), str)]
        if isinstance(memories, list)
        else []
    )


def align(predicted: list[dict], reference: list[dict]) -> list[tuple[int, int, float]]:
    """(predicted index, reference index, similarity) of the optimal one-to-one matching, above threshold."""
    if not predicted or not reference:
        return []
    similarity = np.array([[token_f1(p["content"], r["content"]) for r in reference] for p in predicted])
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return [
        (int(i), int(j), float(similarity[i, j]))
        for i, j in zip(rows, cols)
        if similarity[i, j] >= MATCH_THRESHOLD
    ]


def aligned_memories(
    output: str | dict | None, reference: str | dict
) -> tuple[list[dict], list[dict], list[tuple[int, int, float]]]:
    """The predicted memories, the reference memories and their alignment, exactly as a window is scored
    (also what `dimmem inspect` shows side by side)."""
    ref_value, _ = parse_json(reference)
    value, _ = parse_json(output) if output is not None else (None, None)
    predicted = usable_memories(value)
    return predicted, ref_value["memories"], align(predicted, ref_value["memories"])


def pair_scores(p: dict, r: dict, similarity: float) -> dict:
    scores = {
        "type_accuracy": float(p.get("type") == r["type"]),
        "time_exact": float(p.get("time") == r["time"]),
        "time_overlap": float(time_overlap(p.get("time"), r["time"])),
        "keyword_f1": set_f1(p.get("keywords"), r["keywords"]),
        "source_jaccard": jaccard(p.get("source_turns"), r["source_turns"]),
        "content_similarity": similarity,
    }
    agreement = []
    for name in DIMENSIONS:
        both = p.get(name) is not None and r[name] is not None
        agreement.append(float((p.get(name) is None) == (r[name] is None)))
        scores[f"{name}_null_agreement"] = agreement[-1]
        if both:
            scores[f"{name}_f1"] = token_f1(p[name], r[name])
    scores["dimension_null_agreement"] = float(np.mean(agreement))
    return scores


def score_window(
    output: str, reference: str | dict, scope: TurnScope | None = None, finish_reason: str | None = None
) -> dict:
    """Everything measured on one window (plain numbers and lists, JSON-ready)."""
    value, _ = parse_json(output)
    report = validate("extract", output, scope)
    rules = report.rules_broken()
    predicted, ref_memories, matches = aligned_memories(output, reference)
    pairs = [pair_scores(predicted[i], ref_memories[j], s) for i, j, s in matches]
    return {
        "parsed": value is not None,
        "schema_valid": value is not None and not {"json", "schema"} & set(rules),
        "rules": rules,
        "valid": report.ok,
        "truncated": finish_reason == "length",
        "predicted": len(predicted),
        "reference": len(ref_memories),
        "matched": len(matches),
        "confusion": [[ref_memories[j]["type"], predicted[i].get("type")] for i, j, _ in matches],
        "pairs": pairs,
    }


def aggregate(windows: list[dict]) -> dict:
    """Run-level metrics; docs/eval.md defines each."""
    n = len(windows)
    rate = lambda key: sum(w[key] for w in windows) / n if n else 0.0  # noqa: E731
    predicted, reference, matched = (
        sum(w[k] for w in windows) for k in ("predicted", "reference", "matched")
    )
    precision = matched / predicted if predicted else float(reference == 0)
    recall = matched / reference if reference else float(predicted == 0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    pairs = [p for w in windows for p in w["pairs"]]
    keys = sorted({k for p in pairs for k in p})
    field = {
        k: float(np.mean([p[k] for p in pairs if k in p])) for k in keys
    }  # absent: no pair to score it on
    rule_counts = Counter(rule for w in windows for rule in w["rules"])
    confusion = {t: {u: 0 for u in (*MEMORY_TYPES, "other")} for t in MEMORY_TYPES}
    for ref_type, pred_type in (c for w in windows for c in w["confusion"]):
        confusion[ref_type][pred_type if pred_type in MEMORY_TYPES else "other"] += 1
    # n/a without a matched pair: no field was scored
    field_quality = float(np.mean([field.get(k, 0.0) for k in FIELD_SCORES])) if pairs else None
    schema_valid = rate("schema_valid")
    headline = 100 * (
        0.2 * schema_valid + 0.8 * f1 * (0.5 + 0.5 * _headline_fields(field_quality, predicted, reference))
    )
    return {
        "windows": n,
        "parse_rate": rate("parsed"),
        "schema_valid_rate": schema_valid,
        "valid_rate": rate("valid"),
        "truncation_rate": rate("truncated"),
        "rule_violation_rate": {rule: count / n for rule, count in sorted(rule_counts.items())},
        "memories_predicted": predicted,
        "memories_reference": reference,
        "memories_matched": matched,
        "memory_precision": precision,
        "memory_recall": recall,
        "memory_f1": f1,
        "type_accuracy": field.get("type_accuracy", 0.0),
        "time_exact": field.get("time_exact", 0.0),
        "time_overlap": field.get("time_overlap", 0.0),
        "keyword_f1": field.get("keyword_f1", 0.0),
        "source_jaccard": field.get("source_jaccard", 0.0),
        "content_similarity": field.get("content_similarity", 0.0),
        **{f"{d}_null_agreement": field.get(f"{d}_null_agreement", 0.0) for d in DIMENSIONS},
        **{
            f"{d}_f1": field.get(f"{d}_f1") for d in DIMENSIONS
        },  # None when no matched pair has the field on both sides
        "field_quality": field_quality,
        "type_confusion": confusion,
        # format counts for a fifth; the rest is memories found (F1), each worth half for being found and
        # half for its fields, so field scores on a few lucky matches cannot carry a run
        "headline": headline,
    }


def _headline_fields(field_quality: float | None, predicted: int, reference: int) -> float:
    """Field quality in the headline: n/a counts as 1.0 only when there was nothing to match (0 and 0)."""
    # With predictions or references but no pair, F1 is 0 and the field term is multiplied away anyway;
    # with nothing to find and nothing found, every field is vacuously right and must not cost the run.
    if field_quality is not None:
        return field_quality
    return 1.0 if predicted == reference == 0 else 0.0
