"""Teachers answer labeling jobs. `ModelTeacher` asks a model behind any OpenAI-compatible endpoint
through the one model client (`dimmem.llm.ModelClient`: retries, rate limits, truncation, cache);
`data_gen.batch.BatchClient` is the same client posting through the OpenAI Batch API instead;
`data_gen.oracle.OracleTeacher` answers the toy world from its ground truth, without a model."""

from __future__ import annotations

from typing import Protocol

from dimmem.cache import Completion
from dimmem.llm import ModelClient, Usage


class Teacher(Protocol):
    model: str
    usage: Usage

    async def answer(self, job, messages: list[dict], salt: int) -> Completion:
        """The answer to `messages` (the job's prompt, or a repair round of it); `salt` asks anew."""


class ModelTeacher:
    def __init__(self, client: ModelClient):
        self.client, self.model, self.usage = client, client.model, client.usage

    async def answer(self, job, messages: list[dict], salt: int) -> Completion:
        return await self.client.acomplete(job.task, messages, job.scope, salt=salt, label=job.id)
