"""The oracle teacher: labels toy-world jobs from their ground truth, through the same interface as a
model."""

from __future__ import annotations

from dimmem.cache import Completion
from dimmem.contract.records import canonical_json
from dimmem.contract.toyworld import ToyDialogue
from dimmem.llm import Usage


class OracleTeacher:
    model = "toy-oracle"

    def __init__(self, world: list[ToyDialogue]):
        self.records = {d.conversation.id: d.records for d in world}
        self.queries = {q.id: q.truth for d in world for q in d.queries}
        self.by_content = {r.content: r for d in world for r in d.records}
        self.usage = Usage()

    async def answer(self, job, messages: list[dict], salt: int) -> Completion:
        return Completion(canonical_json(job.task, self.value(job)), "stop")

    def value(self, job) -> dict:
        if job.task == "extract":
            return {"memories": self._window_memories(job.window)}
        if job.task == "parse_query":
            return self.queries[job.id]
        new, old = (self.by_content.get(job.payload[k]["content"]) for k in ("new", "candidate"))
        if new is not None and old is not None and new.supersedes == old.id:
            return {"action": "SUPERSEDE", "memory": new.answer(job.payload["new"]["source_turns"])}
        return {"action": "KEEP_BOTH", "memory": None}

    def _window_memories(self, window) -> list[dict]:
        """Records whose last source turn is new in this window, citing the turns of theirs that are new."""
        local = dict(zip((t.id for t in window.turns), window.local_ids))
        new_ids = {t.id for t in window.new}
        return [
            rec.answer([local[t] for t in rec.source_turns if t in new_ids])
            for rec in self.records[window.conversation_id]
            if rec.source_turns[-1] in new_ids
        ]
