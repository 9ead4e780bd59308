"""One job from prompt to label: cached request, truncation retry, validation, repair, or quarantine."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from data_gen.config import DatagenConfig
from data_gen.jobs import Job
from data_gen.store import Completion, Store, digest
from data_gen.teacher import TeacherError
from dimmem.prompts import load_prompt
from dimmem.validate import validate


@dataclass
class Outcome:
    job: Job
    status: str  # "labeled" | "repaired" | "quarantined"
    value: dict | None = None
    reason: str | None = None


@dataclass
class Accounting:
    requests_sent: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    truncation_retries: int = 0

    def add(self, completion: Completion, price, factor: float = 1.0) -> None:
        self.requests_sent += 1
        self.input_tokens += completion.input_tokens
        self.output_tokens += completion.output_tokens
        if price is not None:
            self.cost_usd += factor * (completion.input_tokens * price.input + completion.output_tokens * price.output) / 1e6


class Deferred(Exception):
    """Batch mode: this request is queued for the next batch instead of being sent now."""


@dataclass
class BatchQueue:
    requests: dict[str, tuple[Job, list[dict], int]] = field(default_factory=dict)


class Labeler:
    def __init__(self, teacher, store: Store, cfg: DatagenConfig, accounting: Accounting, price=None):
        self.teacher, self.store, self.cfg, self.accounting, self.price = teacher, store, cfg, accounting, price
        self.queue: BatchQueue | None = None  # set in batch mode
        self.inflight: dict[str, asyncio.Future] = {}
        self.repair_prompt = load_prompt("repair")

    def job_key(self, job: Job) -> str:
        return digest({"task": job.task, "job": job.id, "prompt": job.prompt.sha, "model": self.teacher.model})

    def request_key(self, job: Job, attempt: int, messages: list[dict], max_tokens: int) -> str:
        """Prompt version, model, generation parameters and the window content (in the messages)."""
        t = self.cfg.teacher
        return digest({"prompt": [job.prompt.id, job.prompt.sha], "model": self.teacher.model, "messages": messages,
                       "params": {"temperature": t.temperature, "max_tokens": max_tokens, "structured": t.structured_outputs,
                                  "extra": t.extra_body}, "attempt": attempt})

    async def request(self, job: Job, attempt: int, messages: list[dict], max_tokens: int) -> Completion:
        key = self.request_key(job, attempt, messages, max_tokens)
        if (cached := self.store.get(key)) is not None:
            self.accounting.cache_hits += 1
            return cached
        if (error := self.store.request_error(key)) is not None:
            raise TeacherError(error)
        if self.queue is not None:
            self.queue.requests[key] = (job, messages, max_tokens)
            raise Deferred
        if key in self.inflight:  # the same prompt is on its way already: share its answer, pay once
            self.accounting.cache_hits += 1
            return await asyncio.shield(self.inflight[key])
        self.inflight[key] = asyncio.ensure_future(self._send(key, job, messages, max_tokens))
        try:
            return await self.inflight[key]
        finally:
            self.inflight.pop(key, None)

    async def _send(self, key: str, job: Job, messages: list[dict], max_tokens: int) -> Completion:
        completion = await self.teacher.complete(job, messages, max_tokens)
        self.store.put(key, job.id, self.teacher.model, completion)  # durable before anything else happens
        self.accounting.add(completion, self.price)
        return completion

    async def answer(self, job: Job, attempt: int, messages: list[dict]) -> Completion:
        """A completion, retried with double the token budget while it is cut off by max_tokens."""
        budget = self.cfg.teacher.max_tokens
        completion = await self.request(job, attempt, messages, budget)
        while completion.finish_reason == "length" and budget < self.cfg.teacher.max_tokens_cap:
            budget = min(budget * 2, self.cfg.teacher.max_tokens_cap)
            self.accounting.truncation_retries += 1
            completion = await self.request(job, attempt, messages, budget)
        return completion

    async def label(self, job: Job) -> Outcome:
        job_key = self.job_key(job)
        attempt, reason = self.store.job_state(job_key)
        if reason is not None:
            if not self.cfg.retry_quarantined:
                return Outcome(job, "quarantined", reason=reason)
            attempt += 1
        outcome = await self._label(job, attempt)
        self.store.set_job(job_key, job.id, attempt, outcome.reason)
        return outcome

    async def _label(self, job: Job, attempt: int) -> Outcome:
        messages = job.messages
        try:
            for repair in range(self.cfg.teacher.repair_rounds + 1):
                completion = await self.answer(job, attempt, messages)
                if completion.finish_reason == "length":
                    return Outcome(job, "quarantined", reason=f"truncated: still cut off at max_tokens={self.cfg.teacher.max_tokens_cap}")
                result = validate(job.task, completion.text, job.scope)
                if result.ok:
                    return Outcome(job, "repaired" if repair else "labeled", value=result.value)
                messages = messages + [{"role": "assistant", "content": completion.text},
                                       self.repair_prompt.render(report=result.report())[1]]
        except TeacherError as exc:
            return Outcome(job, "quarantined", reason=f"request_failed: {exc}")
        return Outcome(job, "quarantined", reason=f"invalid after {self.cfg.teacher.repair_rounds} repair round(s): "
                                                  f"{', '.join(result.rules_broken())}\n{result.report()}")


async def label_all(labeler: Labeler, jobs: list[Job], concurrency: int, progress=None) -> list[Outcome | None]:
    """Label jobs with at most `concurrency` in flight; in batch mode deferred jobs come back as None."""
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Job) -> Outcome | None:
        async with gate:
            try:
                outcome = await labeler.label(job)
            except Deferred:
                outcome = None
            if progress is not None:
                progress(outcome)
            return outcome

    return await asyncio.gather(*(one(job) for job in jobs))
