"""`dimmem eval extraction --benchmark locomo`: any extractor's records scored against LoCoMo's own
annotations (eval/locomo_gold.py), conversation by conversation.

LoCoMo is windowed with the project's windowing (25/5 by default, the paper's); the extractor answers
every window; each answer becomes the records the memory runtime would keep (`keep_valid`: the validator's
verdict, pointers resolved). Those records are scored against the gold:

- pointers, turn level: a gold evidence turn is found when a record cites it with an accepted speaker
  (the observation's person, or the turn's own speaker, which the contract's speaker rule asks for);
  precision over the distinct (speaker, turn) pairs the records cite;
- facts, by content: observations and records of the same session aligned one-to-one (Hungarian, most
  total similarity among pairs at or above the threshold), by embedding cosine and by token F1, each
  with and without the pointer agreeing (the record cites one of the observation's evidence turns). A
  record must be about the observation's person (`eval.locomo_match.is_about`: the first participant
  its content names, and its speaker), so a fact given to the other person, or a record that names
  both people with the wrong one first, is a miss. `fact_any_speaker` aligns without that rule;
  `speaker_accuracy` is the share of its matches about the right person, `wrong_person_rate` the share
  of everything written that states an observation of the wrong person;
- precision is over everything the extractor wrote (`emitted`): every memory an answer lists, kept,
  refused or repeated, the unfinished one of an answer cut at its budget, and one for an answer with no
  usable memory list at all; the fact F1 of each threshold of a sweep shows whether a lead holds;
- dimensions: for each `fact` match whose observation has dimensions read from the dialogue
  (docs/locomo-dimensions.md), time (as dates: within the gold's span) and location, reason and purpose
  (as phrases): precision over the records that fill one, recall over the observations that have one;
- events: the same alignment against `event_summary` (the person rule included), and again requiring
  the record's time to fall in the days before the session date;
- format: parse, schema-valid and valid rates, answers cut at their budget, records per window, tokens
  per record, dimension fill rates, time-format and overlap-rule rates per memory.

Recall and precision are micro-averaged; 95% intervals come from resampling sessions (the bootstrap),
overall and per conversation. Observations are incomplete, so precision is a lower bound: a true memory
LoCoMo did not annotate counts against it.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dimmem.contract.annotations import DIMENSION_KEYS, ConversationGold, Gold, conversation_gold
from dimmem.contract.conversation import Conversation
from dimmem.contract.records import MEMORY_FIELDS
from dimmem.contract.timespan import overlaps, parse_span
from dimmem.contract.validate import complete_memories, parse_json
from dimmem.contract.windows import Window
from dimmem.runtime.extractors import WindowRecords, keep_valid
from eval.extraction import Prediction, Reference, require_predictions
from eval.locomo_gold import MEASURES
from eval.locomo_match import align, dimension_agrees, is_about
from eval.locomo_sample import write_sample
from eval.metrics import token_f1
from eval.sources import answers

if TYPE_CHECKING:
    from dimmem.cache import ResponseCache
    from eval.config import ExtractionRun, LocomoExtraction

# the fact alignments: (name, measure, pointer must agree); all but `fact_any_speaker` need the right person
FACT_VARIANTS = (
    ("fact", "cosine", False),
    ("fact_pointer", "cosine", True),
    ("fact_lexical", "token_f1", False),
    ("fact_lexical_pointer", "token_f1", True),
    ("fact_any_speaker", "cosine", False),
)
# ratio metrics: name -> (numerator count, denominator count); a fact's precision is over everything the
# extractor wrote (`emitted`), not only what the validator kept
RATIOS = {
    "pointer_recall": ("pointer_found", "pointer_gold"),
    "pointer_precision": ("pointer_correct", "pointer_cited"),
    **{
        f"{name}_{kind}": (f"{name}_matched", denominator)
        for name, _, _ in FACT_VARIANTS
        for kind, denominator in (("recall", "observations"), ("precision", "emitted"))
    },
    "speaker_accuracy": ("fact_any_speaker_right_person", "fact_any_speaker_matched"),
    # records that state an observation by content but give it to the wrong person, of all written
    "wrong_person_rate": ("fact_any_speaker_wrong_person", "emitted"),
    "event_recall": ("event_matched", "events"),
    "event_time_recall": ("event_time_matched", "events"),
    **{
        f"{name}_{kind}": (f"{name}_correct", f"{name}_{denominator}")
        for name in DIMENSION_KEYS
        for kind, denominator in (("recall", "gold"), ("precision", "predicted"))
    },
}
F1S = ("pointer", *(name for name, _, _ in FACT_VARIANTS), *DIMENSION_KEYS)


@dataclass
class ScoredWindow:
    window: Window
    prediction: Prediction
    kept: WindowRecords
    memories: int  # objects the answer lists under `memories` (a cut answer: the complete ones)
    parsed: bool
    schema_valid: bool

    @property
    def cut(self) -> bool:
        return self.prediction.finish_reason == "length"

    @property
    def emitted(self) -> int:
        """What the extractor wrote here, each counted against its precision: every memory listed (kept,
        refused or repeated), the unfinished one of a cut answer, one for an answer with none usable."""
        if not self.parsed:
            return self.memories + 1 if self.cut else 1
        return max(self.memories, 1) if self.kept.failure is not None else self.memories


@dataclass
class ConversationScore:
    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # session -> counts
    matches: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)  # variant -> gold -> rec


def score_windows(windows: list[Window], predictions: dict[str, Prediction]) -> list[ScoredWindow]:
    out = []
    for w in windows:
        p = predictions[w.id]
        value, _ = parse_json(p.output) if p.output else (None, None)
        parsed = value is not None
        if not parsed and p.finish_reason == "length":  # cut off: its complete records, as the runtime keeps
            value = complete_memories(p.output)
        kept = keep_valid(w, value if value is not None else p.error or f"{w.id}: not a JSON object")
        memories = value.get("memories") if value is not None else None
        out.append(
            ScoredWindow(
                w,
                p,
                kept,
                len(memories) if isinstance(memories, list) else 0,
                parsed,
                parsed and not {"json", "schema"} & {i.rule for i in kept.issues},
            )
        )
    return out


def _in_days_before(record_time: str | None, day: str, days: int) -> bool:
    if not record_time:
        return False
    end = date.fromisoformat(day)
    return overlaps(parse_span(record_time), (end - timedelta(days=days), end))


def score_conversation(
    conv: Conversation,
    gold: ConversationGold,
    records: list[dict],
    emitted: Counter,
    vectors: Callable[[list[str]], np.ndarray],
    thresholds: dict[str, float],
    bench: LocomoExtraction,
) -> ConversationScore:
    """Every count of one conversation, per session (the bootstrap's unit), and the matches made.
    `emitted`: per session, what the extractor wrote there (`emitted`), the precisions' denominator."""
    session_of = {t.id: t.session_id for t in conv.turns}
    speaker_of = {t.id: t.speaker for t in conv.turns}
    participants = conv.speakers
    score = ConversationScore()
    count = score.counts
    record_sessions = [{session_of[t] for t in r["source_turns"]} for r in records]
    for r in records:
        count[session_of[r["source_turns"][0]]]["records"] += 1
    for session, n in emitted.items():
        count[session]["emitted"] += n

    _count_pointers(count, gold, records, session_of)
    record_vectors = vectors([r["content"] for r in records]) if records else None
    for kind, items in (("observations", gold.observations), ("events", gold.events)):
        for g in items:
            count[g.session][kind] += 1
        if not items or not records:
            continue
        eligible = np.array([[g.session in sessions for sessions in record_sessions] for g in items])
        about = np.array([[is_about(r, g, participants, speaker_of) for r in records] for g in items])
        similarity = {
            "cosine": vectors([g.content for g in items]) @ record_vectors.T,
            "token_f1": np.array(
                [
                    [token_f1(g.content, r["content"]) if ok else 0.0 for r, ok in zip(records, row)]
                    for g, row in zip(items, eligible)
                ]
            ),
        }
        if kind == "observations":
            cites = np.array(
                [[bool(set(g.evidence) & set(r["source_turns"])) for r in records] for g in items]
            )
            variants = [
                (n, m, (eligible & cites if p else eligible) & (about if n != "fact_any_speaker" else True))
                for n, m, p in FACT_VARIANTS
            ]
            for measure, values in bench.sweep.model_dump().items():
                for threshold in values:
                    for i, _, _ in align(similarity[measure], eligible & about, threshold):
                        count[items[i].session][f"sweep_{measure}_{threshold:.2f}_matched"] += 1
        else:
            in_time = np.array(
                [[_in_days_before(r.get("time"), g.date, bench.event_days) for r in records] for g in items]
            )
            variants = [
                ("event", "cosine", eligible & about),
                ("event_time", "cosine", eligible & about & in_time),
            ]
        for name, measure, mask in variants:
            pairs = align(similarity[measure], mask, thresholds[measure])
            score.matches[name] = {items[i].id: (records[j]["id"], s) for i, j, s in pairs}
            for i, j, _ in pairs:
                count[items[i].session][f"{name}_matched"] += 1
                if name == "fact_any_speaker":
                    right = "right" if about[i, j] else "wrong"
                    count[items[i].session][f"fact_any_speaker_{right}_person"] += 1
                if name == "fact":
                    _count_dimensions(count[items[i].session], items[i], records[j])
    return score


def _count_pointers(
    count: dict[str, Counter], gold: ConversationGold, records: list[dict], session_of
) -> None:
    """Pointers, turn level: distinct evidence turns, each with the speakers a record may cite it under."""
    accepted: dict[str, set[str]] = defaultdict(set)
    for g in gold.observations:
        for turn in g.evidence:
            accepted[turn] |= g.speakers
    cited = {(r["speaker"], t) for r in records for t in r["source_turns"]}
    for speaker, turn in cited:
        count[session_of[turn]]["pointer_cited"] += 1
        count[session_of[turn]]["pointer_correct"] += speaker in accepted.get(turn, ())
    for turn, speakers in accepted.items():
        count[session_of[turn]]["pointer_gold"] += 1
        count[session_of[turn]]["pointer_found"] += any((s, turn) in cited for s in speakers)


def _count_dimensions(count: Counter, gold: Gold, record: dict) -> None:
    """A matched pair's dimensions against the ones read from the dialogue (where they were read)."""
    if gold.dimensions is None:
        return
    for name in DIMENSION_KEYS:
        truth, said = gold.dimensions.get(name), record.get(name)
        count[f"{name}_pairs"] += 1
        count[f"{name}_gold"] += truth is not None
        count[f"{name}_predicted"] += said is not None
        count[f"{name}_correct"] += (
            truth is not None and said is not None and dimension_agrees(name, said, truth)
        )


def ratios(totals: Counter | dict) -> dict[str, float | None]:
    """Every ratio metric and F1 from summed counts (None where the denominator is 0)."""
    out: dict[str, float | None] = {}
    for name, (num, den) in RATIOS.items():
        out[name] = totals.get(num, 0) / totals[den] if totals.get(den) else None
    for name in F1S:
        p, r = out[f"{name}_precision"], out[f"{name}_recall"]
        out[f"{name}_f1"] = 2 * p * r / (p + r) if p is not None and r is not None and p + r else 0.0
    return out


def sensitivity(totals: Counter, bench: LocomoExtraction) -> dict[str, dict[str, float]]:
    """Fact F1 (content, the right person) at each threshold of the sweep, per measure."""
    out: dict[str, dict[str, float]] = {}
    for measure, values in bench.sweep.model_dump().items():
        out[measure] = {}
        for threshold in values:
            matched = totals.get(f"sweep_{measure}_{threshold:.2f}_matched", 0)
            r = matched / totals["observations"] if totals.get("observations") else 0.0
            p = matched / totals["emitted"] if totals.get("emitted") else 0.0
            out[measure][f"{threshold:.2f}"] = 2 * p * r / (p + r) if p + r else 0.0
    return out


def bootstrap(units: list[Counter], samples: int, seed: int = 0) -> dict[str, list[float] | None]:
    """95% percentile intervals of every ratio metric, resampling the units (sessions) with replacement."""
    if not units or samples < 1:
        return {}
    keys = sorted({k for u in units for k in u})
    table = np.array([[u[k] for k in keys] for u in units], dtype=float)
    rng = np.random.default_rng(seed)
    draws = table[rng.integers(0, len(units), size=(samples, len(units)))].sum(axis=1)
    values: dict[str, list[float]] = defaultdict(list)
    for row in draws:
        for name, value in ratios(dict(zip(keys, row))).items():
            if value is not None:
                values[name].append(value)
    return {
        name: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if v else None
        for name, v in ((n, values.get(n, [])) for n in ratios(Counter()))
    }


def format_stats(scored: list[ScoredWindow], count_tokens: Callable[[str], int]) -> dict:
    """How the answers look, whatever they match: rates per window and per memory."""
    n = len(scored)
    records = [r for s in scored for r in s.kept.records]
    memories = sum(s.memories for s in scored)
    per_memory = Counter(
        (issue.rule, s.window.id, issue.index)
        for s in scored
        for issue in s.kept.issues
        if issue.index is not None
    )
    broken = Counter(rule for rule, _, _ in per_memory)
    rules = Counter(rule for s in scored for rule in {i.rule for i in s.kept.issues})
    tokens = [count_tokens(json.dumps({k: r[k] for k in MEMORY_FIELDS}, ensure_ascii=False)) for r in records]
    return {
        "windows": n,
        "parse_rate": sum(s.parsed for s in scored) / n if n else 0.0,
        "schema_valid_rate": sum(s.schema_valid for s in scored) / n if n else 0.0,
        "valid_rate": sum(s.parsed and not s.kept.issues for s in scored) / n if n else 0.0,
        "truncation_rate": sum(s.cut for s in scored) / n if n else 0.0,
        "cut_answers": sum(s.cut for s in scored),  # finish_reason "length": ran into the token budget
        "emitted": sum(s.emitted for s in scored),
        # cut off, yet with complete records before the cut (kept, as the runtime's extractor keeps them)
        "cut_windows_kept": sum(not s.parsed and bool(s.kept.records) for s in scored),
        "failed_windows": sum(s.kept.failure is not None for s in scored),
        "memories_predicted": memories,
        "records": len(records),
        "rejected_memories": sum(len(s.kept.rejected) for s in scored),
        "repeated_memories": sum(s.kept.repeated for s in scored),  # word for word again: kept once
        "records_per_window": len(records) / n if n else 0.0,
        "tokens_per_record": float(np.mean(tokens)) if tokens else None,
        # the share of the kept records that fill each dimension
        "dimension_fill": {
            name: sum(r.get(name) is not None for r in records) / len(records) if records else None
            for name in DIMENSION_KEYS
        },
        "time_format_rate": 1 - broken["time_format"] / memories if memories else None,
        "overlap_violation_rate": broken["source_turns_overlap"] / memories if memories else None,
        "rule_violation_rate": {rule: c / n for rule, c in sorted(rules.items())},
    }


# --- the run ---------------------------------------------------------------------------------------


def select(conversations: list[Conversation], wanted: list[str] | None) -> list[Conversation]:
    ids = [c.id for c in conversations]
    if not wanted:
        return conversations
    unknown = [w for w in wanted if w not in ids]
    if unknown:
        raise ValueError(f"conversations {unknown} not in the input (it holds {', '.join(ids)})")
    return [c for c in conversations if c.id in set(wanted)]


def check_prediction_windows(path: str | Path, windows: list[Window], known: set[str], source: Path) -> None:
    """Refuse stored answers for conversations the input does not hold, or for windows this benchmark
    does not cut (another windowing): scored, they would be dropped without a word."""
    ours = {w.id for w in windows}
    scored = {w.conversation_id for w in windows}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            window_id = json.loads(line)["window_id"]
            conversation = window_id.rpartition("/")[0]
            if conversation not in known:
                raise ValueError(
                    f"{path}: line {number}: window {window_id!r} is of conversation {conversation!r}, "
                    f"which {source} does not hold"
                )
            if conversation in scored and window_id not in ours:
                raise ValueError(
                    f"{path}: line {number}: window {window_id!r} is not one of this benchmark's windows "
                    f"of {conversation} (answers made with other locomo.windows settings?)"
                )


class _Vectors:
    """Unit-length embeddings, each distinct text encoded once per run."""

    def __init__(self, encoder):
        self.encoder, self.known = encoder, {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self.known))
        if todo:
            self.known.update(zip(todo, self.encoder.encode(todo)))
        return np.array([self.known[t] for t in texts], dtype=np.float32).reshape(len(texts), -1)


def run_locomo(cfg: ExtractionRun, out: Path, cache: ResponseCache) -> dict:
    """Window, extract, score and write the run folder; returns metrics.json's content."""
    from dimmem.contract.prompts import extract_messages
    from dimmem.runtime.embed import make_embedder

    input_path, everything, conversations, windows = benchmark_windows(cfg)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    refs = [Reference(win.id, extract_messages(win), "", win.scope, win) for win in windows]
    predictions, source = answers(cfg, refs, cache)
    wall = time.perf_counter() - start
    if cfg.predictions:
        check_prediction_windows(cfg.predictions, windows, {c.id for c in everything}, input_path)
    require_predictions([win.id for win in windows], predictions)

    scored = score_windows(windows, predictions)
    vectors = _Vectors(make_embedder())
    fitted, thresholds = fit_or_given(cfg.locomo, input_path, everything, conversations, vectors)
    golds = {c.id: conversation_gold(c) for c in conversations}
    by_conversation: dict[str, list[dict]] = defaultdict(list)
    emitted: dict[str, Counter] = defaultdict(Counter)
    for s in scored:
        by_conversation[s.window.conversation_id] += s.kept.records
        emitted[s.window.conversation_id][s.window.new[0].session_id] += s.emitted
    scores = {
        c.id: score_conversation(
            c, golds[c.id], by_conversation[c.id], emitted[c.id], vectors, thresholds[c.id], cfg.locomo
        )
        for c in conversations
    }
    fresh = [p for p in predictions.values() if not p.cached] if source.generates else []
    metrics = {
        "benchmark": "locomo",
        **score_metrics(cfg.locomo, scores, golds, thresholds),
        **format_stats(scored, _token_counter(cfg.locomo)),
        "conversations": [c.id for c in conversations],
        "thresholds": {
            "measures": {m: sorted({t[m] for t in thresholds.values()}) for m in MEASURES},
            "fitted": fitted,
            "given": cfg.locomo.thresholds is not None,
        },
        "unknown_evidence": [u for g in golds.values() for u in g.unknown_evidence],
        **speed(fresh, wall),
        "run": run_info(cfg, out, input_path, source.name, source.label(cfg)),
    }
    _write_windows(out, scored, golds, scores)
    matches = {cid: s.matches.get("fact", {}) for cid, s in scores.items()}
    write_sample(out, conversations, golds, by_conversation, matches, vectors, thresholds, cfg.locomo.sample)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    from eval.report import plot_locomo, write_locomo_report

    plot_locomo(metrics, out)
    write_locomo_report(metrics, out)
    return metrics


def benchmark_windows(
    cfg: ExtractionRun,
) -> tuple[Path, list[Conversation], list[Conversation], list[Window]]:
    """(input file, all its conversations, the ones scored, their windows) of a LoCoMo run."""
    from dimmem.contract.formats import extract_format
    from dimmem.contract.loaders.locomo import load_locomo
    from dimmem.contract.prompts import extract_prompt_counter
    from dimmem.contract.windows import window_conversations
    from dimmem.paths import shared_data

    bench = cfg.locomo
    input_path = Path(bench.input) if bench.input else shared_data("locomo/locomo10.json")
    everything = load_locomo(input_path)
    conversations = select(everything, bench.conversations)
    unannotated = [c.id for c in conversations if not c.metadata.get("observation")]
    if unannotated:
        raise ValueError(
            f"{input_path}: {', '.join(unannotated)} carry no `observation` annotations, the benchmark's gold"
        )
    w = bench.windows
    render = extract_format(cfg.extractor_format).messages
    counter = extract_prompt_counter(w.tokenizer, render=render) if w.max_tokens else None
    return (
        input_path,
        everything,
        conversations,
        window_conversations(conversations, w.window, w.overlap, w.max_tokens, counter),
    )


def fit_or_given(
    bench: LocomoExtraction,
    input_path: Path,
    everything: list[Conversation],
    scored: list[Conversation],
    vectors,
) -> tuple[dict | None, dict[str, dict[str, float]]]:
    """(the fit, or None when the config gives them; each scored conversation's thresholds)."""
    if bench.thresholds is not None:
        return None, {c.id: bench.thresholds.model_dump() for c in scored}
    from dimmem.paths import cache_dir
    from dimmem.runtime.embed import default_model_path
    from eval.locomo_gold import calibrate

    fitted = calibrate(input_path, everything, vectors, default_model_path(), cache_dir())
    return fitted, {c.id: {m: fitted[m]["held_out"][c.id] for m in MEASURES} for c in scored}


def score_metrics(bench: LocomoExtraction, scores: dict, golds: dict, thresholds: dict) -> dict:
    """The ratios over every session with their intervals, the threshold sweep, the counts, and the same
    per conversation."""
    units = [counts for s in scores.values() for counts in s.counts.values()]
    totals = sum(units, Counter())
    per_conversation = {
        cid: {
            **ratios(sum(s.counts.values(), Counter())),
            "ci": bootstrap(list(s.counts.values()), bench.bootstrap),
            "thresholds": thresholds[cid],
            "observations": len(golds[cid].observations),
            "events": len(golds[cid].events),
            "records": sum(s.counts[u]["records"] for u in s.counts),
        }
        for cid, s in scores.items()
    }
    return {
        **ratios(totals),
        "ci": bootstrap(units, bench.bootstrap),
        "sensitivity": sensitivity(totals, bench),
        "counts": dict(sorted(totals.items())),
        "sessions": len(units),
        "per_conversation": per_conversation,
    }


def _token_counter(bench: LocomoExtraction) -> Callable[[str], int]:
    from dimmem.contract.tokens import load_tokenizer
    from dimmem.paths import shared_data

    tokenizer = load_tokenizer(bench.tokenizer or str(shared_data("qwen3-tokenizer")))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def speed(fresh: list[Prediction], wall: float) -> dict:
    """What the model did in this run (answers not from its cache): windows and output tokens a second."""
    return {
        "generated_windows": len(fresh),  # asked of the model in this run (not answered from its cache)
        "windows_per_s": len(fresh) / wall if fresh and wall else None,
        "output_tokens_per_s": sum(p.completion_tokens or 0 for p in fresh) / wall
        if fresh and wall
        else None,
    }


def run_info(cfg: ExtractionRun, out: Path, input_path: Path, source: str, model: str) -> dict:
    bench = cfg.locomo
    return {
        "name": out.name,
        "benchmark": "locomo",
        "input": str(input_path),
        "source": source,
        "model": model,
        "constrained": bool(cfg.model and cfg.model.structured_outputs),
        "max_tokens": cfg.max_tokens,
        "extractor_format": cfg.extractor_format,
        "windows": bench.windows.model_dump(),
        "event_days": bench.event_days,
        "bootstrap": bench.bootstrap,
    }


def _write_windows(out: Path, scored: list[ScoredWindow], golds: dict, scores: dict) -> None:
    """windows.jsonl (one window's turns, gold observations and kept records, with the content matches
    of the `fact` alignment: what the inspector shows side by side), predictions.jsonl (re-scorable) and
    records.jsonl (the kept records in datagen's labels layout: `dimmem eval retrieval --memories`)."""
    home: dict[str, str] = {}  # observation -> the window whose new part holds its first evidence turn
    for s in scored:
        new = {t.id for t in s.window.new}
        for g in golds[s.window.conversation_id].observations:
            if g.evidence and g.evidence[0] in new:
                home[g.id] = s.window.id
    with (
        open(out / "windows.jsonl", "w", encoding="utf-8") as rows,
        open(out / "predictions.jsonl", "w", encoding="utf-8") as preds,
        open(out / "records.jsonl", "w", encoding="utf-8") as kept,
    ):
        for s in scored:
            kept.write(
                json.dumps(
                    {
                        "task": "extract",
                        "window_id": s.window.id,
                        "conversation_id": s.window.conversation_id,
                        "memories": s.kept.records,
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
            w = s.window
            matches = scores[w.conversation_id].matches.get("fact", {})
            by_record = {rid: (gid, sim) for gid, (rid, sim) in matches.items()}
            gold = [g for g in golds[w.conversation_id].observations if home.get(g.id) == w.id]
            row = {
                "window_id": w.id,
                "conversation_id": w.conversation_id,
                "parsed": s.parsed,
                "schema_valid": s.schema_valid,
                "valid": s.parsed and not s.kept.issues,
                "truncated": s.prediction.finish_reason == "length",
                "rules": sorted({i.rule for i in s.kept.issues}),
                "failure": s.kept.failure,
                "predicted": len(s.kept.records),
                "reference": len(gold),
                "matched": sum(g.id in matches for g in gold),
                "turns": [
                    {
                        "id": t.id,
                        "speaker": t.speaker,
                        "text": t.text,
                        "time": t.session_time,
                        "new": i >= len(w.context),
                    }
                    for i, t in enumerate(w.turns)
                ],
                "gold": [
                    {
                        "id": g.id,
                        "person": g.person,
                        "content": g.content,
                        "evidence": list(g.evidence),
                        "match": matches.get(g.id, (None, None))[0],
                        "similarity": matches.get(g.id, (None, None))[1],
                    }
                    for g in gold
                ],
                "records": [
                    {
                        **{k: r[k] for k in MEMORY_FIELDS},
                        "id": r["id"],
                        "match": by_record.get(r["id"], (None, None))[0],
                        "similarity": by_record.get(r["id"], (None, None))[1],
                    }
                    for r in s.kept.records
                ],
            }
            rows.write(json.dumps(row, ensure_ascii=False) + "\n")
            preds.write(json.dumps(s.prediction.row(), ensure_ascii=False) + "\n")
