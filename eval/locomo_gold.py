"""LoCoMo's own annotations as gold memories, and the similarity threshold that says when a record states one.

LoCoMo's authors wrote, per session and speaker, `observation`: atomic facts each with the dialogue id
(or ids) of its evidence turn, and `event_summary`: each speaker's life events of the session, under the
session's date. Observations are gold `content` + `source_turns` + person; events are gold content +
date. Neither carries a type or the location / reason / purpose dimensions.

Similarity thresholds are fitted, never chosen by hand: an observation against the turns of its own
session, its evidence turns the positives and the rest the negatives, rendered as the rule extractor
renders a turn (`Speaker: text`); the threshold is the one of highest F1 separating them. Each
conversation is scored with the threshold fitted on the other conversations of the file
(leave-one-conversation-out), so no score is made with a threshold fitted on its own conversation. The
fit depends only on the input file, the embedder and the measures, so it is cached beside the embedder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dimmem.contract.annotations import conversation_gold
from dimmem.contract.conversation import Conversation, Turn
from dimmem.runtime.extractors import turn_memory
from eval.metrics import token_f1

MEASURES = ("cosine", "token_f1")  # embedding cosine (all-MiniLM-L6-v2), and the lexical one beside it
CALIBRATION_VERSION = 1  # bump when the fit's positives, negatives or rule change


def turn_text(turn: Turn) -> str:
    """A turn as the rule extractor states it."""
    return turn_memory(turn, turn.id)["content"]


# --- thresholds ------------------------------------------------------------------------------------


def best_f1_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(threshold, F1) of the cut `score >= threshold` that best separates positives from negatives."""
    order = np.argsort(-scores, kind="stable")
    ranked, hits = scores[order], labels[order].astype(bool)
    true_pos = np.cumsum(hits)
    last_of_tie = np.r_[ranked[1:] != ranked[:-1], True]  # a cut falls between distinct scores only
    chosen = np.arange(len(ranked)) + 1
    f1 = 2 * true_pos / (chosen + hits.sum())
    f1 = np.where(last_of_tie, f1, -1.0)
    best = int(np.argmax(f1))
    return float(ranked[best]), float(f1[best])


def calibration_pairs(
    conversations: list[Conversation], encode: Callable[[list[str]], np.ndarray]
) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """{conversation: {measure: (scores, labels)}} of every observation against its session's turns."""
    out = {}
    for conv in conversations:
        gold = conversation_gold(conv).observations
        by_session: dict[str, list[Turn]] = {}
        for turn in conv.turns:
            by_session.setdefault(turn.session_id, []).append(turn)
        texts = {t.id: turn_text(t) for t in conv.turns}
        turn_vectors = dict(zip(texts, encode(list(texts.values()))))
        obs_vectors = encode([g.content for g in gold])
        scores: dict[str, list[float]] = {m: [] for m in MEASURES}
        labels: list[bool] = []
        for g, vector in zip(gold, obs_vectors):
            for turn in by_session[g.session]:
                scores["cosine"].append(float(vector @ turn_vectors[turn.id]))
                scores["token_f1"].append(token_f1(g.content, texts[turn.id]))
                labels.append(turn.id in g.evidence)
        out[conv.id] = {m: (np.array(scores[m]), np.array(labels)) for m in MEASURES}
    return out


def fit_thresholds(pairs: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]) -> dict:
    """Per measure: the threshold fitted on all conversations, and each conversation's leave-one-out one."""

    def fit(measure: str, conversations: list[str]) -> tuple[float, float]:
        scores, labels = (np.concatenate([pairs[c][measure][i] for c in conversations]) for i in (0, 1))
        return best_f1_threshold(scores, labels)

    fitted: dict = {}
    for measure in MEASURES:
        threshold, f1 = fit(measure, list(pairs))
        held_out = {  # a one-conversation file can only fit on itself
            conv: fit(measure, [c for c in pairs if c != conv] or [conv])[0] for conv in pairs
        }
        fitted[measure] = {"all": threshold, "all_f1": f1, "held_out": held_out}
    return fitted


def calibrate(
    input_path: str | Path,
    conversations: list[Conversation],
    encode: Callable[[list[str]], np.ndarray],
    embedder_id: str,
    cache_dir: Path,
) -> dict:
    """The fitted thresholds for this LoCoMo file and embedder, from the cache when fitted before."""
    key = hashlib.sha256(
        Path(input_path).read_bytes() + f"\0{embedder_id}\0{CALIBRATION_VERSION}".encode()
    ).hexdigest()[:16]
    path = cache_dir / f"locomo-thresholds-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    fitted = fit_thresholds(calibration_pairs(conversations, encode))
    fitted["fitted_on"] = "each observation against its session's turns (evidence turns positive)"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fitted, indent=2) + "\n")
    tmp.replace(path)
    return fitted
