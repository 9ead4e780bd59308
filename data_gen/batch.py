"""OpenAI Batch API mode: queued requests go out as one JSONL batch, results land in the same store.

Batch ids are stored as soon as a batch is created, so a killed run resumes by polling its open batches
instead of paying for them twice.
"""
from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from data_gen.labeler import Labeler
from data_gen.teacher import completion_from_body


async def submit(labeler: Labeler, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    lines, job_ids = [], {}
    for key, (job, messages, max_tokens) in labeler.queue.requests.items():
        body = labeler.teacher.request_body(job.task, messages, max_tokens, job.scope)
        lines.append(json.dumps({"custom_id": key, "method": "POST", "url": "/v1/chat/completions", "body": body}))
        job_ids[key] = job.id
    payload = ("\n".join(lines) + "\n").encode()
    client = labeler.teacher.client
    uploaded = await client.files.create(file=("requests.jsonl", io.BytesIO(payload)), purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    (folder / f"{batch.id}.json").write_text(json.dumps(job_ids))  # custom_id -> job id, for the results
    labeler.store.set_batch(batch.id, uploaded.id, batch.status)
    return batch.id


async def collect(labeler: Labeler, batch_id: str, folder: Path, poll_seconds: float, price_factor: float) -> None:
    """Wait for a batch to end, then store every result; requests it did not answer become request errors."""
    client = labeler.teacher.client
    while True:
        batch = await client.batches.retrieve(batch_id)
        labeler.store.set_batch(batch_id, batch.input_file_id, batch.status)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            break
        await asyncio.sleep(poll_seconds)
    job_ids = json.loads((folder / f"{batch_id}.json").read_text())
    answered = set()
    for file_id in (batch.output_file_id, batch.error_file_id):
        if not file_id:
            continue
        text = (await client.files.content(file_id)).text
        for line in filter(None, text.splitlines()):
            row = json.loads(line)
            key, response = row["custom_id"], row.get("response") or {}
            answered.add(key)
            body = response.get("body") or {}
            if response.get("status_code") == 200:
                completion = completion_from_body(body)
                labeler.store.put(key, job_ids.get(key, ""), labeler.teacher.model, completion)
                labeler.accounting.add(completion, labeler.price, price_factor)
            else:
                error = (row.get("error") or body.get("error") or {}).get("message", "unknown error")
                labeler.store.set_request_error(key, f"batch {batch_id}: {response.get('status_code')} {error}")
    for key in set(job_ids) - answered:
        labeler.store.set_request_error(key, f"batch {batch_id} ended {batch.status} without answering")
    labeler.store.set_batch(batch_id, batch.input_file_id, "done")
