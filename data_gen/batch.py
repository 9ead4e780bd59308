"""The OpenAI Batch API as its own teacher path: `BatchClient` is the model client with its sending
replaced by a queue. A labeling round answers what the cache holds and queues the rest (`Deferred`);
`submit` sends the queue as one JSONL batch, `collect` waits for it and stores every answer in the same
response cache, and the next round finds them there. Batch ids are stored the moment a batch is
created, so a killed run resumes by polling its open batches instead of paying for them twice.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from data_gen.labeler import Deferred
from data_gen.store import JobStore
from dimmem.cache import Completion
from dimmem.llm import ModelClient, completion_from_body


class BatchClient(ModelClient):
    """Answers from the cache; every other request is queued for the next batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.queue: dict[str, tuple[str, dict]] = {}  # request key -> (label, body)

    async def _asend(self, key: str, body: dict, label: str) -> Completion:
        self.queue[key] = (label, body)
        raise Deferred


async def submit(client: BatchClient, jobs: JobStore, folder: Path) -> str:
    """Send the queued requests as one batch; returns its id."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"custom_id": key, "method": "POST", "url": "/v1/chat/completions", "body": body})
        for key, (_, body) in client.queue.items()
    ]
    labels = {key: label for key, (label, _) in client.queue.items()}
    api = client.async_client
    uploaded = await api.files.create(
        file=("requests.jsonl", io.BytesIO(("\n".join(lines) + "\n").encode())), purpose="batch"
    )
    batch = await api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    (folder / f"{batch.id}.json").write_text(json.dumps(labels))  # custom_id -> job id, for the results
    jobs.set_batch(batch.id, uploaded.id, batch.status)
    client.queue = {}
    return batch.id


async def collect(
    client: BatchClient, jobs: JobStore, batch_id: str, folder: Path, poll_seconds: float, price_factor: float
) -> None:
    """Wait for a batch to end, then store every answer; requests it did not answer become request errors."""
    api = client.async_client
    while True:
        batch = await api.batches.retrieve(batch_id)
        jobs.set_batch(batch_id, batch.input_file_id, batch.status)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            break
        await asyncio.sleep(poll_seconds)
    labels = json.loads((folder / f"{batch_id}.json").read_text())
    answered = set()
    for file_id in (batch.output_file_id, batch.error_file_id):
        if not file_id:
            continue
        text = (await api.files.content(file_id)).text
        for line in filter(None, text.splitlines()):
            row = json.loads(line)
            key, response = row["custom_id"], row.get("response") or {}
            answered.add(key)
            body = response.get("body") or {}
            if response.get("status_code") == 200:
                completion = completion_from_body(body)
                client.cache.put(key, completion, labels.get(key, ""), client.model)
                client.usage.answered(completion, client.price, price_factor)
            else:
                error = (row.get("error") or body.get("error") or {}).get("message", "unknown error")
                client.cache.put_error(key, f"batch {batch_id}: {response.get('status_code')} {error}")
    for key in set(labels) - answered:
        client.cache.put_error(key, f"batch {batch_id} ended {batch.status} without answering")
    jobs.set_batch(batch_id, batch.input_file_id, "done")
