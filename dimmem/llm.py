"""The one client for OpenAI-compatible endpoints: the teacher (data_gen), the served extractor and its
query parser and consolidator (runtime), and the models evaluation asks (eval). Sync and async, one
policy for everything that goes wrong:

- transport faults (timeouts, dropped connections, 5xx, 408) are retried with exponential backoff and
  full jitter, up to `max_retries`; a 429 waits for the server's `retry-after`, and everyone waits;
- 401/403/404 mean the endpoint refuses every request (bad key, unknown model, wrong URL):
  `FatalModelError`, so a run stops instead of failing each request in turn;
- an answer cut at `max_tokens` (finish_reason "length", which structured outputs do not prevent) is
  asked again with twice the budget up to `max_tokens_cap`; a budget the endpoint refuses as larger
  than its context is clamped to what fits (the error says the context; the prompt's size comes from
  the error or an earlier answer), the context is remembered so later answers are never re-asked
  beyond it, and a prompt that cannot fit at all is a `PromptTooLongError` naming both sizes;
- requests per minute and tokens per minute are held by a token bucket shared by all requests.

Every answer can go through a `ResponseCache`, keyed by the exact request body, so nothing paid for is
asked twice. `usage` counts requests, cache hits, retries, tokens and cost.

    client = ModelClient(ModelConfig(base_url="http://localhost:8000/v1", model="dimmem-extractor"))
    record = client.json("extract", extract_messages(window), scope=window.scope)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field, fields, replace

import openai
from pydantic import Field

from dimmem.cache import Completion, ResponseCache, digest
from dimmem.config import Section
from dimmem.contract.records import response_format
from dimmem.contract.validate import TurnScope
from dimmem.errors import DimmemError


class ModelError(DimmemError):
    """This request got no usable answer; the message says why."""


class FatalModelError(ModelError):
    """The endpoint refuses every request (bad key, unknown model, wrong URL): stop, do not go on."""


class UnreachableError(ModelError):
    """No connection to the endpoint, after every retry: nothing answers at that address (yet)."""


class ContextLimitError(ModelError):
    """The endpoint refused a budget larger than its context; `context` and `prompt` tokens when it said."""

    def __init__(self, message: str, context: int | None, prompt: int | None):
        super().__init__(message)
        self.context, self.prompt = context, prompt


class PromptTooLongError(ModelError):
    """The prompt leaves no room for an answer in the endpoint's context: no budget can fix it."""

    def __init__(self, message: str, context: int, prompt: int | None):
        super().__init__(message)
        self.context, self.prompt = context, prompt


class Price(Section):
    input: float  # USD per million tokens
    output: float


class ModelConfig(Section):
    """An OpenAI-compatible endpoint and how to ask it. The key is read from the environment variable
    `api_key_env` names, never from a file."""

    base_url: str | None = None  # None: the OpenAI API
    model: str
    api_key_env: str | None = None
    structured_outputs: bool = True  # strict JSON Schema per task; False: plain JSON mode
    temperature: float = 0.0
    max_tokens: int = Field(1024, ge=1)
    max_tokens_cap: int = Field(
        4096, ge=1
    )  # truncated answers are asked again with double the budget up to this
    timeout: float = Field(120.0, gt=0)
    max_retries: int = Field(4, ge=0)
    backoff_base: float = Field(1.0, ge=0)
    backoff_max: float = Field(60.0, ge=0)
    rpm: float | None = Field(None, gt=0)  # requests per minute
    tpm: float | None = Field(
        None, gt=0
    )  # tokens per minute (prompt estimate + max_tokens, as providers count)
    concurrency: int = Field(8, ge=1)  # requests in flight
    # passed through, e.g. {"chat_template_kwargs": {"enable_thinking": false}} for vLLM
    extra_body: dict = {}

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass
class Usage:
    """What a client has done so far (thread-safe)."""

    requests: int = 0  # answers received from the endpoint
    cache_hits: int = 0
    retries: int = 0  # transport faults and 429s asked again
    rate_limited: int = 0
    truncation_retries: int = 0
    context_clamps: int = 0
    cut_answers_kept: int = 0  # answers still cut off at the cap whose whole part was kept (`json`)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def answered(self, completion: Completion, price: Price | None, price_factor: float = 1.0) -> None:
        cost = 0.0
        if price is not None:
            cost = (
                price_factor
                * (completion.input_tokens * price.input + completion.output_tokens * price.output)
                / 1e6
            )
        self.add(
            requests=1,
            input_tokens=completion.input_tokens,
            output_tokens=completion.output_tokens,
            cost_usd=cost,
        )

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


class RateLimiter:
    """Requests and tokens per minute as token buckets with 10 s of burst, shared by threads and tasks.
    A reservation may take the bucket into debt; the caller waits the time the debt takes to repay, so
    requests go out in the order they asked. A 429 pauses everyone."""

    BURST_SECONDS = 10.0

    def __init__(self, rpm: float | None, tpm: float | None):
        self.rates = {"requests": (rpm or 0) / 60, "tokens": (tpm or 0) / 60}
        self.capacity = {k: max(rate * self.BURST_SECONDS, 1.0) for k, rate in self.rates.items()}
        self.level = dict(self.capacity)
        self.stamp = time.monotonic()
        self.paused_until = 0.0
        self.lock = threading.Lock()

    def reserve(self, tokens: int) -> float:
        """Take one request of `tokens` from the buckets; returns the seconds to wait before sending."""
        with self.lock:
            now = time.monotonic()
            wait = self.paused_until - now
            for kind, rate in self.rates.items():
                if not rate:
                    continue
                level = min(self.capacity[kind], self.level[kind] + (now - self.stamp) * rate)
                level -= min(1.0 if kind == "requests" else float(tokens), self.capacity[kind])
                self.level[kind] = level
                wait = max(wait, -level / rate)
            self.stamp = now
            return max(wait, 0.0)

    def pause(self, seconds: float) -> None:
        with self.lock:
            self.paused_until = max(self.paused_until, time.monotonic() + seconds)

    def paused_for(self) -> float:
        with self.lock:
            return max(self.paused_until - time.monotonic(), 0.0)


_CONTEXT = re.compile(
    r"max_model_len=(?:max_total_tokens=)?(\d+)|max_total_tokens=(\d+)|maximum context length is (\d+)"
)
_PROMPT = re.compile(
    r"(\d+) in the messages|prompt contains (?:at least )?(\d+)(?: input)? tokens|(\d+) input tokens"
)


def _first_number(pattern: re.Pattern, text: str) -> int | None:
    match = pattern.search(text)
    return int(next(g for g in match.groups() if g)) if match else None


def _retry_after(error: openai.APIStatusError) -> float | None:
    headers = error.response.headers if error.response is not None else {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, ValueError, TypeError):
            continue
    return None


def completion_from_body(body: dict, seconds: float | None = None) -> Completion:
    """A chat.completion JSON body (online, or a Batch API output line) as a Completion."""
    choice, usage = body["choices"][0], body.get("usage") or {}
    return Completion(
        choice["message"].get("content") or "",
        choice.get("finish_reason"),
        usage.get("prompt_tokens") or 0,
        usage.get("completion_tokens") or 0,
        seconds,
    )


class ModelClient:
    def __init__(
        self,
        config: ModelConfig,
        cache: ResponseCache | None = None,
        price: Price | None = None,
        key_extra: dict | None = None,
        http_client=None,
        async_http_client=None,
    ):
        """`key_extra`: more context for cache keys (eval adds the endpoint: another server answering to the
        same model name is another model); `price`: for the cost in `usage`."""
        key = config.api_key()
        if not key and config.base_url is None:
            raise FatalModelError(
                f"no API key for the OpenAI API: set the environment variable {config.api_key_env}"
            )
        self.config, self.cache, self.price, self.key_extra = config, cache, price, key_extra or {}
        self.model = config.model
        self.where = config.base_url or "the OpenAI API"
        # retries are this client's policy, not the openai package's
        self._sync = openai.OpenAI(
            api_key=key or "EMPTY",
            base_url=config.base_url,
            timeout=config.timeout,
            max_retries=0,
            http_client=http_client,
        )
        self._async_args = dict(
            api_key=key or "EMPTY",
            base_url=config.base_url,
            timeout=config.timeout,
            max_retries=0,
            http_client=async_http_client,
        )
        self._async: openai.AsyncOpenAI | None = None
        self.limiter = RateLimiter(config.rpm, config.tpm)
        self.usage = Usage()
        self._formats: dict[str, dict] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self.context_limit: int | None = None  # the endpoint's context in tokens, once it has said it

    @property
    def async_client(self) -> openai.AsyncOpenAI:
        if self._async is None:  # made on first use, inside the event loop that uses it
            self._async = openai.AsyncOpenAI(**self._async_args)
        return self._async

    # --- the request ----------------------------------------------------------------------------------
    def body(
        self,
        task: str | None,
        messages: list[dict],
        max_tokens: int | None = None,
        scope: TurnScope | None = None,
        schema: dict | None = None,
    ) -> dict:
        """The chat-completions body (also what a Batch API line carries). `task` None: free text. An
        extract window's schema is its own (`records.window_schema`), or `schema` (a `response_format`
        of another extract format); other tasks share one, built once."""
        cfg = self.config
        if task is None:
            fmt = None
        elif cfg.structured_outputs and schema is not None:
            fmt = schema
        elif cfg.structured_outputs and task == "extract" and scope is not None:
            fmt = response_format(task, scope.citable())
        else:
            if task not in self._formats:
                self._formats[task] = (
                    response_format(task) if cfg.structured_outputs else {"type": "json_object"}
                )
            fmt = self._formats[task]
        body = {
            "model": cfg.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "max_tokens": max_tokens or cfg.max_tokens,
            **cfg.extra_body,
        }
        if fmt is not None:
            body["response_format"] = fmt
        return body

    def request_key(self, body: dict, salt=None) -> str:
        """The cache key: the exact request, plus `salt` (e.g. an attempt number that asks anew)."""
        return digest({"body": body, "salt": salt, **self.key_extra})

    # --- one request, with the retry policy -----------------------------------------------------------
    def send(self, body: dict, salt=None, label: str = "") -> Completion:
        key = self.request_key(body, salt)
        if (hit := self._cached(key)) is not None:
            return hit
        for attempt in range(self.config.max_retries + 1):
            time.sleep(self._wait_turn(body))
            started = time.perf_counter()
            try:
                raw = self._sync.post("/chat/completions", body=body, cast_to=str)
            except openai.OpenAIError as exc:
                time.sleep(self._after_error(exc, attempt))
                continue
            return self._store(key, body, raw, time.perf_counter() - started, label)
        raise AssertionError("unreachable: the last attempt raises")

    async def asend(self, body: dict, salt=None, label: str = "") -> Completion:
        key = self.request_key(body, salt)
        if (hit := self._cached(key)) is not None:
            return hit
        if key in self._inflight:  # the same request is on its way: share its answer, pay once
            self.usage.add(cache_hits=1)
            return await asyncio.shield(self._inflight[key])
        future = self._inflight[key] = asyncio.ensure_future(self._asend(key, body, label))
        try:
            return await future
        finally:
            self._inflight.pop(key, None)

    async def _asend(self, key: str, body: dict, label: str) -> Completion:
        for attempt in range(self.config.max_retries + 1):
            await asyncio.sleep(self._wait_turn(body))
            started = time.perf_counter()
            try:
                # the low-level post sends the body as built and returns the raw JSON: `create()` would
                # re-walk schema and messages with its type-driven transform (see BENCHMARKS.md)
                raw = await self._apost(body)
            except openai.OpenAIError as exc:
                await asyncio.sleep(self._after_error(exc, attempt))
                continue
            return self._store(key, body, raw, time.perf_counter() - started, label)
        raise AssertionError("unreachable: the last attempt raises")

    async def _apost(self, body: dict) -> str:
        return await self.async_client.post("/chat/completions", body=body, cast_to=str)

    def _cached(self, key: str) -> Completion | None:
        if self.cache is None:
            return None
        if (error := self.cache.error(key)) is not None:
            raise ModelError(error)
        if (hit := self.cache.get(key)) is not None:
            self.usage.add(cache_hits=1)
        return hit

    def _wait_turn(self, body: dict) -> float:
        estimate = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 3 + body["max_tokens"]
        return max(self.limiter.reserve(estimate), self.limiter.paused_for())

    def _store(self, key: str, body: dict, raw: str, seconds: float, label: str) -> Completion:
        try:
            completion = completion_from_body(json.loads(raw), seconds)
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise ModelError(
                f"{self.where} answered something that is not a chat completion ({exc}): {raw[:200]!r}"
            ) from exc
        if self.cache is not None:
            self.cache.put(key, completion, label, body["model"])  # durable before anything else happens
        self.usage.answered(completion, self.price)
        return completion

    def _after_error(self, exc: openai.OpenAIError, attempt: int) -> float:
        """Seconds to wait before the next attempt, or raise when there is none."""
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403, 404):
                raise FatalModelError(
                    f"{self.where} refused {self.model!r} ({status}): {exc.message}"
                ) from None
            if status == 400 and (context := _first_number(_CONTEXT, exc.message)) is not None:
                raise ContextLimitError(
                    f"{self.where}: {exc.message}", context, _first_number(_PROMPT, exc.message)
                )
            if status < 500 and status not in (408, 409, 429):
                raise ModelError(f"{self.where} refused the request ({status}): {exc.message}") from None
            problem = f"{status} {'rate limited' if status == 429 else 'server error'}"
        elif isinstance(exc, openai.APITimeoutError):
            problem = f"timeout after {self.config.timeout}s"
        elif isinstance(exc, openai.APIConnectionError):
            problem = f"connection error: {exc}"
        else:
            raise ModelError(f"{self.where}: {type(exc).__name__}: {exc}") from None
        if attempt >= self.config.max_retries:
            error = UnreachableError if isinstance(exc, openai.APIConnectionError) else ModelError
            raise error(f"{self.where}: gave up after {attempt + 1} attempts: {problem}") from None
        self.usage.add(retries=1)
        delay = random.uniform(0, min(self.config.backoff_max, self.config.backoff_base * 2**attempt))
        if isinstance(exc, openai.RateLimitError):
            delay = _retry_after(exc) or delay
            self.limiter.pause(delay)  # everyone waits, not just this request
            self.usage.add(rate_limited=1)
            return 0.0  # the pause is waited in _wait_turn
        return delay

    # --- an answer, with the truncation policy --------------------------------------------------------
    def complete(
        self,
        task: str | None,
        messages: list[dict],
        scope: TurnScope | None = None,
        max_tokens: int | None = None,
        salt=None,
        label: str = "",
        schema: dict | None = None,
    ) -> Completion:
        """The answer, asked again with a larger budget while it is cut off (up to the cap, or what the
        endpoint's context leaves); the last answer comes back even when still cut off (finish_reason
        "length", `max_tokens` the budget it had): the caller decides."""
        budgets = self._budgets(task, messages, scope, max_tokens, schema)
        body = next(budgets)
        while True:
            try:
                outcome = self.send(body, salt, label)
            except ContextLimitError as exc:
                outcome = exc
            try:
                body = budgets.send(outcome)
            except StopIteration as done:
                return done.value

    async def acomplete(
        self,
        task: str | None,
        messages: list[dict],
        scope: TurnScope | None = None,
        max_tokens: int | None = None,
        salt=None,
        label: str = "",
        schema: dict | None = None,
    ) -> Completion:
        """`complete`, awaited: the same budgets, the same requests."""
        budgets = self._budgets(task, messages, scope, max_tokens, schema)
        body = next(budgets)
        while True:
            try:
                outcome = await self.asend(body, salt, label)
            except ContextLimitError as exc:
                outcome = exc
            try:
                body = budgets.send(outcome)
            except StopIteration as done:
                return done.value

    def _budgets(self, task, messages, scope, max_tokens, schema):
        """The truncation policy, once for both ways of asking: yields each request's body, is sent its
        answer (or the endpoint's ContextLimitError), returns the answer to keep."""
        budget, ceiling, last = max_tokens or self.config.max_tokens, self.config.max_tokens_cap, None
        while True:
            outcome = yield self.body(task, messages, budget, scope, schema)
            if isinstance(outcome, ContextLimitError):
                budget = ceiling = self._clamp(outcome, budget, last)
                continue
            if (bigger := self._next_budget(outcome, budget, ceiling)) is None:
                return replace(outcome, max_tokens=budget)
            budget, last = bigger, outcome

    def _next_budget(self, completion: Completion, budget: int, ceiling: int) -> int | None:
        """Twice the budget for an answer cut off, within the cap and, once the endpoint has said its
        context, within what that context leaves after this prompt (so no request is sent to be refused);
        None when there is no larger budget to ask with."""
        if self.context_limit and completion.input_tokens:
            ceiling = min(ceiling, self.context_limit - completion.input_tokens)
        if completion.finish_reason != "length" or budget >= ceiling:
            return None
        self.usage.add(truncation_retries=1)
        return min(2 * budget, ceiling)

    def _clamp(self, exc: ContextLimitError, budget: int, last: Completion | None) -> int:
        """The largest budget the endpoint's context leaves for this prompt, or PromptTooLongError when
        there is none. The context is remembered: later answers are not re-asked beyond it."""
        self.context_limit = exc.context
        prompt = exc.prompt or (last.input_tokens if last is not None and last.input_tokens else None)
        if prompt is None:
            fit = exc.context - 1 if budget >= exc.context else budget // 2
        else:
            fit = exc.context - prompt
        if fit >= budget:  # by the endpoint's own numbers the budget fitted: nothing to clamp
            raise ModelError(f"{self.where} refused max_tokens={budget}: {exc}") from None
        if fit < 1:
            size = f"the prompt ({prompt} tokens)" if prompt else "the prompt"
            raise PromptTooLongError(
                f"{size} does not fit the context of {exc.context} tokens of {self.model!r} at "
                f"{self.where} (shorten the windows, e.g. windows.max_tokens, or serve a longer context)",
                exc.context,
                prompt,
            ) from None
        self.usage.add(context_clamps=1)
        return fit

    # --- JSON answers (the runtime) -------------------------------------------------------------------
    def json(
        self,
        task: str,
        messages: list[dict],
        scope: TurnScope | None = None,
        attempts: int = 2,
        schema: dict | None = None,
        decode=json.loads,
        partial=None,
    ) -> dict:
        """The answer of a DimMem task as a dict (`decode`d from the text; `schema`: see `body`); an
        answer that is not a JSON object is asked again (`attempts` in all), one still cut off at the cap
        is an error, unless `partial(text)` makes an answer of what came before the cut (extraction:
        `dimmem.contract.validate.complete_memories`)."""
        problems = []
        for attempt in range(attempts):
            completion = self.complete(task, messages, scope, salt=attempt or None, schema=schema)
            if completion.finish_reason == "length":
                if partial is not None and (kept := partial(completion.text)) is not None:
                    self.usage.add(cut_answers_kept=1)
                    return kept
                budget = completion.max_tokens or self.config.max_tokens_cap
                limit = "the cap" if budget >= self.config.max_tokens_cap else "what the context leaves"
                raise ModelError(
                    f"{task}: answer still cut off at max_tokens={budget} ({limit}); "
                    "raise max_tokens_cap or shorten the window"
                )
            try:
                value = decode(completion.text)
            except json.JSONDecodeError as exc:
                problems.append(f"not JSON ({exc.msg} at char {exc.pos})")
                continue
            if isinstance(value, dict):
                return value
            problems.append(f"JSON {type(value).__name__}, expected an object")
        raise ModelError(f"{task}: no usable answer in {attempts} attempts: " + "; ".join(problems))
