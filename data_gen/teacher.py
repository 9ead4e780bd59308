"""Teachers label jobs. `OpenAITeacher` talks to any OpenAI-compatible endpoint with the `openai` package:
strict structured outputs (or plain JSON mode), rate limits, 429 retry-after, exponential backoff with
jitter on 5xx, timeouts and connection errors, bounded retries."""
from __future__ import annotations

import asyncio
import json
import os
import random
import time

import openai
from openai import AsyncOpenAI

from data_gen.config import TeacherConfig
from data_gen.store import Completion
from dimmem.records import response_format
from dimmem.validate import TurnScope


class TeacherError(Exception):
    """This request failed for good (retries exhausted, or an error retrying cannot fix)."""


class FatalTeacherError(Exception):
    """The run cannot go on (bad API key, unknown model, wrong URL): stop instead of quarantining everything."""


class RateLimiter:
    """Requests-per-minute and tokens-per-minute token buckets (10 s of burst), plus a shared pause after a 429."""

    BURST_SECONDS = 10.0

    def __init__(self, rpm: float | None, tpm: float | None):
        self.rates = {"requests": (rpm or 0) / 60, "tokens": (tpm or 0) / 60}
        self.capacity = {k: max(rate * self.BURST_SECONDS, 1.0) for k, rate in self.rates.items()}
        self.level = dict(self.capacity)
        self.stamp = time.monotonic()
        self.paused_until = 0.0
        self.lock = asyncio.Lock()

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)

    async def acquire(self, tokens: int) -> None:
        async with self.lock:  # one waiter at a time: first come, first served
            need = {"requests": 1.0, "tokens": float(tokens)}
            while True:
                now = time.monotonic()
                for kind, rate in self.rates.items():
                    self.level[kind] = min(self.capacity[kind], self.level[kind] + (now - self.stamp) * rate)
                self.stamp = now
                waits = [self.paused_until - now]
                for kind, rate in self.rates.items():
                    if rate:  # a request larger than the bucket waits for a full bucket, then goes
                        waits.append((min(need[kind], self.capacity[kind]) - self.level[kind]) / rate)
                wait = max(waits)
                if wait <= 0:
                    for kind, rate in self.rates.items():
                        if rate:
                            self.level[kind] -= need[kind]
                    return
                await asyncio.sleep(wait)


def completion_from_body(body: dict) -> Completion:
    """A chat.completion JSON body (online or from a batch output line) as a stored completion."""
    choice, usage = body["choices"][0], body.get("usage") or {}
    return Completion(choice["message"].get("content") or "", choice.get("finish_reason"),
                      usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))


def retry_after(error: openai.APIStatusError) -> float | None:
    headers = error.response.headers if error.response is not None else {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, ValueError):
            continue
    return None


class OpenAITeacher:
    def __init__(self, cfg: TeacherConfig, http_client=None):
        key = os.environ.get(cfg.api_key_env)
        if not key and cfg.base_url is None:
            raise FatalTeacherError(f"no API key: set the environment variable {cfg.api_key_env}")
        self.cfg = cfg
        self.client = AsyncOpenAI(api_key=key or "EMPTY", base_url=cfg.base_url, timeout=cfg.timeout, max_retries=0,
                                  http_client=http_client)
        self.limiter = RateLimiter(cfg.rpm, cfg.tpm)
        self.model = cfg.model
        self.formats: dict[str, dict] = {}

    def request_body(self, task: str, messages: list[dict], max_tokens: int, scope: TurnScope | None = None) -> dict:
        """The chat-completions body for one request (also what batch mode writes to its JSONL). An extract
        window's schema is its own (`records.window_schema`: memories cite only its new turns, each with
        their speaker); other tasks share one schema, built once."""
        if self.cfg.structured_outputs and task == "extract" and scope is not None:
            fmt = response_format(task, scope.citable())
        else:
            if task not in self.formats:
                self.formats[task] = response_format(task) if self.cfg.structured_outputs else {"type": "json_object"}
            fmt = self.formats[task]
        return {"model": self.cfg.model, "messages": messages, "temperature": self.cfg.temperature,
                "max_tokens": max_tokens, "response_format": fmt, **self.cfg.extra_body}

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter."""
        return random.uniform(0, min(self.cfg.backoff_max, self.cfg.backoff_base * 2 ** attempt))

    async def complete(self, job, messages: list[dict], max_tokens: int) -> Completion:
        body = self.request_body(job.task, messages, max_tokens, job.scope)
        estimate = sum(len(m["content"]) for m in messages) // 3 + max_tokens  # rough: ~3 characters a token
        last = "no attempt"
        for attempt in range(self.cfg.max_retries + 1):
            await self.limiter.acquire(estimate)
            try:
                # The low-level post sends the body as built and hands back the raw JSON: `create()` would
                # re-walk schema and messages with its type-driven transform and build pydantic models, the
                # largest client CPU cost per request at high concurrency (see BENCHMARKS.md).
                response = json.loads(await self.client.post("/chat/completions", body=body, cast_to=str))
            except openai.RateLimitError as exc:
                delay = retry_after(exc) or self.backoff(attempt)
                self.limiter.pause(delay)  # everyone waits, not just this request
                last = f"429 rate limited (retry after {delay:.1f}s)"
            except openai.APITimeoutError:
                last = f"timeout after {self.cfg.timeout}s"
            except openai.APIConnectionError as exc:
                last = f"connection error: {exc}"
            except openai.APIStatusError as exc:
                if exc.status_code in (401, 403, 404):
                    raise FatalTeacherError(f"{exc.status_code} from {self.cfg.base_url or 'OpenAI'}: {exc.message}") from None
                if exc.status_code < 500 and exc.status_code != 408:
                    raise TeacherError(f"{exc.status_code}: {exc.message}") from None
                last = f"{exc.status_code} server error"
            else:
                return completion_from_body(response)
            if attempt < self.cfg.max_retries:
                await asyncio.sleep(0 if last.startswith("429") else self.backoff(attempt))
        raise TeacherError(f"gave up after {self.cfg.max_retries + 1} attempts: {last}")
