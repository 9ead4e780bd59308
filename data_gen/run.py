"""A datagen run from config to outputs: load, window, label (online or Batch API), build the dataset."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

from data_gen import batch as batch_api
from data_gen.augment import base_id
from data_gen.batch import BatchClient
from data_gen.config import DatagenConfig
from data_gen.dataset import build_dataset, dataset_card, global_memories, quarantine_reasons, write_outputs
from data_gen.jobs import Job, consolidate_jobs, extract_jobs, parse_query_jobs
from data_gen.labeler import Labeler, Outcome, label_all
from data_gen.store import JobStore
from data_gen.teacher import ModelTeacher
from dimmem.cache import ResponseCache
from dimmem.config import ConfigError
from dimmem.contract.conversation import Conversation
from dimmem.contract.loaders import LOADERS, conversation_from_messages, load_conversations
from dimmem.contract.loaders._fields import Record
from dimmem.llm import ModelClient, Usage
from dimmem.progress import progress


def load_source(cfg: DatagenConfig) -> tuple[list[Conversation], list | None]:
    """Conversations (those held out left out, renamed copies added), and the toy world when the source
    is generated."""
    conversations, world = _load(cfg)
    for key in ("include", "exclude"):
        named = getattr(cfg.source, key) or []
        if unknown := sorted(set(named) - {c.id for c in conversations}):
            raise ConfigError(f"source.{key}: {unknown} not in the source (it holds {len(conversations)})")
    if cfg.source.include is not None:
        conversations = [c for c in conversations if c.id in cfg.source.include]
    conversations = [c for c in conversations if c.id not in cfg.source.exclude]
    if cfg.augment.renamed_copies:
        from data_gen.augment import renamed_copies

        a = cfg.augment
        conversations += renamed_copies(conversations, a.renamed_copies, a.seed, a.lookalike_share)
    return conversations, world


def held_out(cfg: DatagenConfig, conversations: list[Conversation]) -> dict | None:
    """The held-out conversations checked against what was labeled (`dimmem datagen check-overlap`)."""
    if not cfg.source.exclude:
        return None
    from data_gen.overlap import as_json, check_overlap

    excluded = [c for c in _load(cfg)[0] if c.id in cfg.source.exclude]
    rows = check_overlap({c.id: c.turns for c in conversations}, excluded)
    return as_json(rows, cfg.out, f"{cfg.source.format}:{cfg.source.input}")


def _load(cfg: DatagenConfig) -> tuple[list[Conversation], list | None]:
    src = cfg.source
    if src.format == "toy":
        from dimmem.contract.toyworld import generate_world

        world = generate_world(src.conversations, src.seed, src.sessions, src.stories_per_session)
        return [d.conversation for d in world], world
    if src.format == "hf_messages":
        from datasets import load_dataset, load_from_disk

        rows = (
            load_from_disk(src.input)
            if Path(src.input).is_dir()
            else load_dataset(src.input, split=src.split)
        )
        if hasattr(rows, "keys"):
            rows = rows[src.split]
        return [
            conversation_from_messages(row, Record(src.input, i), f"row-{i}") for i, row in enumerate(rows)
        ], None
    if src.format not in LOADERS:
        raise ConfigError(
            f"unknown source format {src.format!r}; expected toy, hf_messages or one of {sorted(LOADERS)}"
        )
    if not src.input:
        raise ConfigError(f"source format {src.format!r} needs an input file (--input)")
    return load_conversations(src.format, src.input), None


def make_teacher(cfg: DatagenConfig, conversations, world, cache: ResponseCache, http_client=None):
    """The oracle (toy world), the corpus's annotations, or the configured model through the one client,
    online or by batch."""
    if cfg.teacher.kind == "annotations":
        from data_gen.annotations import AnnotationTeacher

        if cfg.tasks.parse_query or cfg.tasks.consolidate:
            raise ConfigError(
                "the annotations teacher labels extraction only: set tasks.parse_query and "
                "tasks.consolidate to false"
            )
        unannotated = [c.id for c in conversations if not c.metadata.get("observation")]
        if unannotated:
            raise ConfigError(
                f"teacher.kind annotations: {', '.join(unannotated[:5])} carry no annotations "
                "(LoCoMo's `observation`)"
            )
        return AnnotationTeacher(conversations)
    if cfg.teacher.kind == "oracle":
        if world is None:
            raise ConfigError("the oracle teacher labels only the toy world (source.format: toy)")
        from data_gen.oracle import OracleTeacher

        return OracleTeacher(world)
    client_class = BatchClient if cfg.batch else ModelClient
    return ModelTeacher(
        client_class(
            cfg.teacher, cache=cache, price=cfg.prices.get(cfg.teacher.model), async_http_client=http_client
        )
    )


class Progress:
    """A progress bar with rate, ETA, money spent and quarantine count."""

    def __init__(self, total: int, desc: str, usage: Usage, enabled: bool):
        self.bar = progress(total=total, desc=desc, unit="job", enabled=enabled)
        self.usage, self.quarantined = usage, 0

    def __call__(self, outcome: Outcome | None) -> None:
        self.quarantined += outcome is not None and outcome.status == "quarantined"
        u = self.usage
        self.bar.set_postfix(
            sent=u.requests,
            cached=u.cache_hits,
            quarantined=self.quarantined,
            cost=f"${u.cost_usd:.4f}",
            refresh=False,
        )
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


async def label_phase(
    labeler: Labeler, jobs: list[Job], cfg: DatagenConfig, desc: str, show: bool
) -> list[Outcome]:
    if not cfg.batch:
        progress = Progress(len(jobs), desc, labeler.teacher.usage, show)
        try:
            return await label_all(labeler, jobs, cfg.teacher.concurrency, progress)
        finally:
            progress.close()
    client, folder = labeler.teacher.client, Path(cfg.out) / "batches"
    while True:  # each round: finish open batches, answer from the cache, submit what is still missing
        for batch_id in labeler.jobs.open_batches():
            await batch_api.collect(
                client, labeler.jobs, batch_id, folder, cfg.batch_poll_seconds, cfg.batch_price_factor
            )
        outcomes = await label_all(labeler, jobs, max(cfg.teacher.concurrency, 256))
        if not client.queue:
            return outcomes
        n = len(client.queue)
        batch_id = await batch_api.submit(client, labeler.jobs, folder)
        print(f"{desc}: submitted batch {batch_id} with {n} requests", file=sys.stderr)


def run(cfg: DatagenConfig, show_progress: bool = True, http_client=None) -> dict:
    started = time.monotonic()
    out = Path(cfg.out)
    conversations, world = load_source(cfg)
    teacher, outcomes = label_source(cfg, conversations, world, show_progress, http_client)
    report = run_report(cfg, teacher, outcomes, conversations, started)
    dataset = build_dataset(
        outcomes, teacher.model, cfg.split.validation, cfg.split.test, cfg.split.seed, group=base_id
    )
    prompts = sorted({o.job.prompt.id for o in outcomes})
    card = dataset_card(
        dataset,
        report,
        cfg.source.format,
        cfg.source.input,
        cfg.license,
        teacher.model,
        prompts,
        quarantine_reasons(outcomes),
    )
    write_outputs(out, dataset, outcomes, report, card)
    return report


def label_source(
    cfg: DatagenConfig, conversations: list[Conversation], world, show_progress: bool, http_client
):
    """The teacher and every job's outcome: the windows and queries first, then the consolidation pairs
    drawn from the records the windows gave."""
    out = Path(cfg.out)
    count_tokens = None
    if cfg.windows.max_tokens:
        from dimmem.contract.prompts import extract_prompt_counter

        count_tokens = extract_prompt_counter(cfg.windows.tokenizer)
    cache, jobs_store = ResponseCache(out / "cache.sqlite"), JobStore(out / "cache.sqlite")
    teacher = make_teacher(cfg, conversations, world, cache, http_client)
    labeler = Labeler(teacher, jobs_store, cfg.teacher, cfg.retry_quarantined)
    try:
        jobs: list[Job] = []
        if cfg.tasks.extract:
            jobs += extract_jobs(
                conversations,
                cfg.windows.window,
                cfg.windows.overlap,
                cfg.windows.max_tokens,
                count_tokens,
                cfg.limit,
            )
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
        jobs_store.close()
        cache.close()
    return teacher, outcomes


def run_report(
    cfg: DatagenConfig, teacher, outcomes: list[Outcome], conversations: list[Conversation], started: float
) -> dict:
    """report.json: the outcomes by status and task, the teacher's usage and cost, its coverage where it
    has one, and the held-out check."""
    usage = teacher.usage
    status = Counter(o.status for o in outcomes)
    n_windows = sum(o.job.task == "extract" for o in outcomes)
    report = {
        "windows": n_windows,
        "other_jobs": len(outcomes) - n_windows,
        "labeled": status["labeled"],
        "repaired": status["repaired"],
        "quarantined": status["quarantined"],
        "by_task": {
            task: dict(Counter(o.status for o in outcomes if o.job.task == task))
            for task in dict.fromkeys(o.job.task for o in outcomes)
        },
        "requests_sent": usage.requests,
        "cache_hits": usage.cache_hits,
        "retries": usage.retries,
        "truncation_retries": usage.truncation_retries,
        "context_clamps": usage.context_clamps,  # budgets cut to what the teacher's context leaves
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": round(usage.cost_usd, 6),
        "teacher_model": teacher.model,
        "batch": cfg.batch,
        "elapsed_s": round(time.monotonic() - started, 2),
    }
    if hasattr(teacher, "coverage"):
        report["coverage"] = teacher.coverage(outcomes)
    if (check := held_out(cfg, conversations)) is not None:
        report["held_out"] = check
    return report
