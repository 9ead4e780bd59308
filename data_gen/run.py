"""A datagen run from config to outputs: load, window, label (online or Batch API), build the dataset."""
from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from data_gen import batch as batch_api
from data_gen.config import DatagenConfig
from data_gen.dataset import build_dataset, dataset_card, global_memories, quarantine_reasons, write_outputs
from data_gen.jobs import Job, consolidate_jobs, extract_jobs, parse_query_jobs
from data_gen.labeler import Accounting, BatchQueue, Labeler, Outcome, label_all
from data_gen.store import Store
from data_gen.teacher import OpenAITeacher
from dimmem.conversation import Conversation
from dimmem.loaders import LOADERS, conversation_from_messages, load_conversations
from dimmem.loaders._fields import Record


def load_source(cfg: DatagenConfig) -> tuple[list[Conversation], list | None]:
    """Conversations, and the toy world when the source is generated."""
    src = cfg.source
    if src.format == "toy":
        from data_gen.toyworld import generate_world

        world = generate_world(src.conversations, src.seed, src.sessions, src.stories_per_session)
        return [d.conversation for d in world], world
    if src.format == "hf_messages":
        from datasets import load_dataset, load_from_disk

        rows = load_from_disk(src.input) if Path(src.input).is_dir() else load_dataset(src.input, split=src.split)
        if hasattr(rows, "keys"):
            rows = rows[src.split]
        return [conversation_from_messages(row, Record(src.input, i), f"row-{i}") for i, row in enumerate(rows)], None
    if src.format not in LOADERS:
        raise ValueError(f"unknown source format {src.format!r}; expected toy, hf_messages or one of {sorted(LOADERS)}")
    if not src.input:
        raise ValueError(f"source format {src.format!r} needs an input file (--input)")
    return load_conversations(src.format, src.input), None


def make_teacher(cfg: DatagenConfig, world, http_client=None):
    if cfg.teacher.kind == "oracle":
        if world is None:
            raise ValueError("the oracle teacher labels only the toy world (source.format: toy)")
        from data_gen.oracle import OracleTeacher

        return OracleTeacher(world)
    return OpenAITeacher(cfg.teacher, http_client=http_client)


class Progress:
    """A progress bar with rate, ETA, money spent and quarantine count."""

    def __init__(self, total: int, desc: str, accounting: Accounting, enabled: bool):
        self.bar = tqdm(total=total, desc=desc, unit="job", disable=not enabled or None)
        self.accounting, self.quarantined = accounting, 0

    def __call__(self, outcome: Outcome | None) -> None:
        self.quarantined += outcome is not None and outcome.status == "quarantined"
        a = self.accounting
        self.bar.set_postfix(sent=a.requests_sent, cached=a.cache_hits, quarantined=self.quarantined, cost=f"${a.cost_usd:.4f}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


async def label_phase(labeler: Labeler, jobs: list[Job], cfg: DatagenConfig, desc: str, show: bool) -> list[Outcome]:
    if not cfg.batch:
        progress = Progress(len(jobs), desc, labeler.accounting, show)
        try:
            return await label_all(labeler, jobs, cfg.teacher.concurrency, progress)
        finally:
            progress.close()
    folder = Path(cfg.out) / "batches"
    while True:  # each round: finish open batches, replay from the store, submit what is still missing
        for batch_id in labeler.store.open_batches():
            await batch_api.collect(labeler, batch_id, folder, cfg.batch_poll_seconds, cfg.batch_price_factor)
        labeler.queue = BatchQueue()
        outcomes = await label_all(labeler, jobs, max(cfg.teacher.concurrency, 256))
        if not labeler.queue.requests:
            labeler.queue = None
            return outcomes
        batch_id = await batch_api.submit(labeler, folder)
        print(f"{desc}: submitted batch {batch_id} with {len(labeler.queue.requests)} requests", file=sys.stderr)


def run(cfg: DatagenConfig, show_progress: bool = True, http_client=None) -> dict:
    started = time.monotonic()
    out = Path(cfg.out)
    conversations, world = load_source(cfg)
    teacher = make_teacher(cfg, world, http_client)
    count_tokens = None
    if cfg.windows.max_tokens:
        from dimmem.prompts import extract_prompt_counter
        from dimmem.tokens import load_tokenizer

        count_tokens = extract_prompt_counter(load_tokenizer(cfg.windows.tokenizer))
    store = Store(out / "cache.sqlite")
    accounting = Accounting()
    labeler = Labeler(teacher, store, cfg, accounting, cfg.prices.get(teacher.model))
    try:
        jobs: list[Job] = []
        if cfg.tasks.extract:
            jobs += extract_jobs(conversations, cfg.windows.window, cfg.windows.overlap, cfg.windows.max_tokens, count_tokens, cfg.limit)
        if cfg.tasks.parse_query:
            jobs += parse_query_jobs(conversations)[: cfg.limit]
        outcomes = asyncio.run(label_phase(labeler, jobs, cfg, "labeling", show_progress))
        if cfg.tasks.consolidate:
            records: dict[str, list[dict]] = {}
            for o in outcomes:
                if o.job.task == "extract" and o.status != "quarantined":
                    records.setdefault(o.job.conversation_id, []).extend(global_memories(o))
            pairs = consolidate_jobs(records, cfg.tasks.consolidate_candidates)[: cfg.limit]
            outcomes += asyncio.run(label_phase(labeler, pairs, cfg, "consolidating", show_progress))
    finally:
        store.close()

    status = Counter(o.status for o in outcomes)
    n_windows = sum(o.job.task == "extract" for o in outcomes)
    report = {"windows": n_windows, "other_jobs": len(outcomes) - n_windows, "labeled": status["labeled"],
              "repaired": status["repaired"], "quarantined": status["quarantined"],
              "by_task": {task: dict(Counter(o.status for o in outcomes if o.job.task == task))
                          for task in dict.fromkeys(o.job.task for o in outcomes)},
              "requests_sent": accounting.requests_sent, "cache_hits": accounting.cache_hits,
              "truncation_retries": accounting.truncation_retries, "input_tokens": accounting.input_tokens,
              "output_tokens": accounting.output_tokens, "cost_usd": round(accounting.cost_usd, 6),
              "teacher_model": teacher.model, "batch": cfg.batch, "elapsed_s": round(time.monotonic() - started, 2)}
    dataset = build_dataset(outcomes, teacher.model, cfg.split.validation, cfg.split.test, cfg.split.seed)
    prompts = sorted({o.job.prompt.id for o in outcomes})
    card = dataset_card(dataset, report, cfg.source.format, cfg.source.input, cfg.license, teacher.model, prompts,
                        quarantine_reasons(outcomes))
    write_outputs(out, dataset, outcomes, report, card)
    return report
