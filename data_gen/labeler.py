"""One job from prompt to label: the teacher's answer (cached and retried by the model client),
validation, repair rounds with the validator's report, or quarantine with the reason."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from data_gen.config import TeacherConfig
from data_gen.jobs import Job
from data_gen.store import JobStore
from data_gen.teacher import Teacher
from dimmem.cache import digest
from dimmem.contract.prompts import load_prompt
from dimmem.contract.validate import validate
from dimmem.llm import FatalModelError, ModelError, PromptTooLongError


@dataclass
class Outcome:
    job: Job
    status: str  # "labeled" | "repaired" | "quarantined"
    value: dict | None = None
    reason: str | None = None
    # the teacher's answers in order, each with the validator's report when it failed: what a person
    # reads to see why a job was repaired or quarantined (jobs.jsonl)
    rounds: list[dict] = field(default_factory=list)


class Deferred(Exception):
    """Batch mode: the request is queued for the next batch instead of being answered now."""


class Labeler:
    def __init__(
        self, teacher: Teacher, jobs: JobStore, config: TeacherConfig, retry_quarantined: bool = False
    ):
        self.teacher, self.jobs, self.retry_quarantined = teacher, jobs, retry_quarantined
        self.repair_rounds, self.max_tokens_cap = config.repair_rounds, config.max_tokens_cap
        self.repair_prompt = load_prompt("repair")

    def job_key(self, job: Job) -> str:
        return digest(
            {"task": job.task, "job": job.id, "prompt": job.prompt.sha, "model": self.teacher.model}
        )

    async def label(self, job: Job) -> Outcome:
        job_key = self.job_key(job)
        attempt, reason = self.jobs.job_state(job_key)
        if reason is not None:
            if not self.retry_quarantined:
                return Outcome(job, "quarantined", reason=reason)
            attempt += 1
        outcome = await self._label(job, attempt)
        self.jobs.set_job(job_key, job.id, attempt, outcome.reason)
        return outcome

    async def _label(self, job: Job, attempt: int) -> Outcome:
        messages, rounds = job.messages, []
        try:
            for repair in range(self.repair_rounds + 1):
                completion = await self.teacher.answer(job, messages, attempt)
                rounds.append({"answer": completion.text, "finish_reason": completion.finish_reason})
                if completion.finish_reason == "length":
                    budget = completion.max_tokens or self.max_tokens_cap
                    limit = "" if budget >= self.max_tokens_cap else " (all the teacher's context leaves)"
                    reason = f"truncated: still cut off at max_tokens={budget}{limit}"
                    return Outcome(job, "quarantined", reason=reason, rounds=rounds)
                result = validate(job.task, completion.text, job.scope)
                if result.ok:
                    return Outcome(
                        job, "repaired" if repair else "labeled", value=result.value, rounds=rounds
                    )
                rounds[-1]["issues"] = result.report()
                messages = messages + [
                    {"role": "assistant", "content": completion.text},
                    self.repair_prompt.render(report=result.report())[1],
                ]
        except FatalModelError:
            raise  # the endpoint refuses everything: stop the run instead of quarantining every job
        except PromptTooLongError as exc:
            return Outcome(job, "quarantined", reason=f"too_long_for_teacher: {exc}", rounds=rounds)
        except ModelError as exc:
            return Outcome(job, "quarantined", reason=f"request_failed: {exc}", rounds=rounds)
        return Outcome(
            job,
            "quarantined",
            reason=f"invalid after {self.repair_rounds} repair round(s): "
            f"{', '.join(result.rules_broken())}\n{result.report()}",
            rounds=rounds,
        )


async def label_all(
    labeler: Labeler, jobs: list[Job], concurrency: int, progress=None
) -> list[Outcome | None]:
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
