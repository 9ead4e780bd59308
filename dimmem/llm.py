"""A model behind any OpenAI-compatible endpoint (the served compact extractor, or a large LLM) answering
the three DimMem tasks with the strict JSON Schema as structured output.

    model = ChatModel(base_url="http://localhost:8000/v1", model="dimmem-extractor")
    answer = model.complete("extract", extract_messages(window))   # a dict, or ModelError

Transport faults (timeouts, connection errors while a server restarts, 429, 5xx) are retried by the
`openai` client with backoff. On top of that: an answer cut at `max_tokens` (finish_reason "length",
which structured outputs do not prevent) is asked again with twice the budget up to `max_tokens_cap`,
and an answer that is not JSON is asked again, both a bounded number of times.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import openai

from dimmem.records import response_format
from dimmem.validate import TurnScope


class ModelError(Exception):
    """The endpoint gave no usable answer after the retries; the message says why."""


@dataclass
class Reply:
    value: dict
    prompt_tokens: int
    completion_tokens: int


@dataclass
class RawReply:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class ChatModel:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, api_key_env: str | None = None,
                 constrained: bool = True, temperature: float = 0.0, max_tokens: int = 1024, max_tokens_cap: int = 4096,
                 timeout: float = 120.0, max_retries: int = 4, attempts: int = 2, extra_body: dict | None = None,
                 http_client=None):
        if api_key is None and api_key_env:  # configs name the variable; the key never sits in a file
            api_key = os.environ.get(api_key_env)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout,
                                    max_retries=max_retries, http_client=http_client)
        self.model, self.constrained, self.temperature = model, constrained, temperature
        self.max_tokens, self.max_tokens_cap, self.attempts = max_tokens, max_tokens_cap, attempts
        # Qwen3 is served with thinking off; vLLM reads this per request (other servers ignore it).
        self.extra_body = {"chat_template_kwargs": {"enable_thinking": False}, **(extra_body or {})}

    def complete(self, task: str, messages: list[dict], max_tokens: int | None = None, scope: TurnScope | None = None) -> dict:
        return self.reply(task, messages, max_tokens, scope).value

    def raw(self, task: str | None, messages: list[dict], max_tokens: int | None = None,
            scope: TurnScope | None = None) -> RawReply:
        """One request, the answer as the model gave it (what evaluation scores); `task` None: free text.
        With `scope` (an extract window's turns), structured outputs use the window's own schema."""
        fmt = response_format(task, scope.citable() if scope else None) if self.constrained and task else openai.NOT_GIVEN
        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, max_tokens=max_tokens or self.max_tokens,
                response_format=fmt,
                extra_body=self.extra_body)
        except (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError, openai.InternalServerError) as exc:
            raise ModelError(f"{task}: {self.client.base_url} unavailable after {self.client.max_retries} retries: "
                             f"{type(exc).__name__}: {exc}") from exc
        except openai.APIStatusError as exc:  # 400/401/404/422: asking again will not help
            raise ModelError(f"{task}: {self.client.base_url} refused the request ({exc.status_code}): {exc.message}") from exc
        choice, usage = response.choices[0], response.usage
        return RawReply(choice.message.content or "", choice.finish_reason, usage.prompt_tokens if usage else 0,
                        usage.completion_tokens if usage else 0)

    def reply(self, task: str, messages: list[dict], max_tokens: int | None = None, scope: TurnScope | None = None) -> Reply:
        budget, problems = max_tokens or self.max_tokens, []
        attempts = 0
        while attempts < self.attempts:
            raw = self.raw(task, messages, budget, scope)
            if raw.finish_reason == "length":
                if budget >= self.max_tokens_cap:
                    raise ModelError(f"{task}: answer still cut at max_tokens={budget} (the cap); "
                                     f"raise max_tokens_cap or shorten the window")
                budget = min(2 * budget, self.max_tokens_cap)  # not counted as an attempt: the budget is bounded
                continue
            attempts += 1
            try:
                value = json.loads(raw.text)
            except json.JSONDecodeError as exc:
                problems.append(f"not JSON ({exc.msg} at char {exc.pos})")
                continue
            if not isinstance(value, dict):
                problems.append(f"JSON {type(value).__name__}, expected an object")
                continue
            return Reply(value, raw.prompt_tokens, raw.completion_tokens)
        raise ModelError(f"{task}: no usable answer in {self.attempts} attempts: " + "; ".join(problems))
