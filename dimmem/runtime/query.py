"""Query parsing: by a model (`ModelQueryParser`) or by rules, the fallback when no model is configured:
time expressions resolved against a reference date, a named place, memory types and assistant recall
from cue words, keywords from content words."""

from __future__ import annotations

import re
from collections import Counter
from datetime import date, datetime, timedelta

from dimmem.contract.prompts import parse_query_messages
from dimmem.contract.records import MEMORY_TYPES
from dimmem.contract.timespan import parse_span
from dimmem.contract.validate import validate
from dimmem.llm import ModelClient, ModelError

MONTHS = {
    m: i
    for i, m in enumerate(
        [
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ],
        start=1,
    )
}
# fmt: off
STOPWORDS = {
    "a", "an", "the", "and", "or", "of", "to", "in", "on", "at", "for", "with", "by", "from", "about",
    "into", "over", "after", "before", "during", "is", "are", "was", "were", "be", "been", "being", "do",
    "does", "did", "done", "have", "has", "had", "i", "you", "he", "she", "it", "we", "they", "me", "him",
    "her", "us", "them", "my", "your", "his", "its", "our", "their", "what", "when", "where", "which", "who",
    "whom", "why", "how", "that", "this", "these", "those", "there", "here", "any", "some", "much", "many",
    "not", "no", "yes", "can", "could", "would", "should", "will", "shall", "may", "might", "must", "tell",
    "remember", "know", "said", "say", "says", "just", "also", "than", "then", "so", "as", "if", "up", "out",
    "happened", "last", "week", "month", "year", "ago",
}
# fmt: on
ASSISTANT_CUES = (
    "you said",
    "you told",
    "you recommended",
    "you suggested",
    "you mentioned",
    "did you",
    "your answer",
    "you gave",
    "you recommend",
    "you suggest",
    "remind me what you",
)
PROFILE_CUES = (
    "like",
    "likes",
    "love",
    "loves",
    "prefer",
    "prefers",
    "favorite",
    "favourite",
    "enjoy",
    "enjoys",
    "hate",
    "allergic",
    "personality",
    "hobby",
    "hobbies",
)
EPISODIC_CUES = (
    "when",
    "did",
    "went",
    "happened",
    "visit",
    "visited",
    "last",
    "yesterday",
    "ago",
    "trip",
    "event",
)


def _month_span(year: int, month: int) -> str:
    return f"{year:04d}-{month:02d}"


def parse_time(question: str, reference: date) -> str | None:
    """The time a question is about, as the record time format, or None: also when the expression names
    no calendar date (2023-02-30) or lies outside the calendar (last week of 0001-01-01)."""
    try:
        value = _parse_time(question.lower(), reference)
        if value is not None:
            parse_span(value)  # a valid record time, or no time at all
        return value
    except (OverflowError, ValueError):
        return None


def _parse_time(text: str, reference: date) -> str | None:
    if m := re.search(r"\b(\d{4}-\d{2}(?:-\d{2})?)\b", text):
        return m.group(1)
    if m := re.search(r"\b(" + "|".join(MONTHS) + r")\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b", text):
        day = date(int(m.group(3)), MONTHS[m.group(1)], int(m.group(2)))
        if re.search(r"\bweek of\s+$", text[: m.start()]):  # "the week of May 1, 2023": seven days
            return f"{day.isoformat()}/{(day + timedelta(days=6)).isoformat()}"
        return day.isoformat()
    if m := re.search(r"\b(" + "|".join(MONTHS) + r")\s+(\d{4})\b", text):
        return _month_span(int(m.group(2)), MONTHS[m.group(1)])
    if "yesterday" in text:
        return (reference - timedelta(days=1)).isoformat()
    if "last week" in text:
        monday = reference - timedelta(days=reference.weekday() + 7)
        return f"{monday.isoformat()}/{(monday + timedelta(days=6)).isoformat()}"
    if "last month" in text:
        last = reference.replace(day=1) - timedelta(days=1)
        return _month_span(last.year, last.month)
    if "last year" in text:
        return f"{reference.year - 1:04d}" if reference.year > 1 else None
    if m := re.search(r"\bin\s+(\d{4})\b", text):
        return m.group(1)
    return None


# "at the harbor", "in Kyoto", "near the old theater": a place the question is about (not "in June 2023",
# "at the moment", "in the morning": months, years and time words end or refuse the phrase)
_PLACE = re.compile(r"\b(?:at|in|near|around)\s+((?:the\s+)?(?:[A-Za-z][\w'-]*)(?:\s+[A-Za-z][\w'-]*){0,2})")
NOT_PLACES = {
    *("moment", "morning", "afternoon", "evening", "night", "time", "end", "past", "future", "general"),
    *("now", "today", "yesterday", "tomorrow", "tonight", "recently", "lately", "days", "ago"),
}


def parse_location(question: str) -> str | None:
    """The place a question names after at/in/near/around: a capitalized name ("Kyoto", "Eagle Peak")
    or "the" and up to two words ("the harbor", "the old theater"), cut at the first stop or time
    word; None when there is none."""
    for match in _PLACE.finditer(question):
        words = match.group(1).split()
        place = words[:1] if words[0].lower() == "the" else []
        for word in words[len(place) :]:
            lowered = word.lower().strip("'")
            if lowered in STOPWORDS or lowered in MONTHS or lowered in NOT_PLACES or lowered.isdigit():
                break
            if word.endswith("'s") or (place[:1] != ["the"] and not word[0].isupper()):
                break  # "in Bob's family": not a place; without "the", names only ("in Kyoto")
            place.append(word)
        if place and place[-1].lower() != "the":
            return " ".join(place)
    return None


def content_words(text: str) -> list[str]:
    """Distinct words that can anchor a memory: no stopwords, month names or possessive 's."""
    words = re.findall(r"[A-Za-z][A-Za-z'\-]+", text)
    out: dict[str, str] = {}
    for word in words:
        word = word[:-2] if word.endswith("'s") else word
        if word.lower() not in STOPWORDS and word.lower() not in MONTHS and len(word) > 2:
            out.setdefault(word.casefold(), word)
    return list(out.values())


def lexical_terms(query: str) -> str:
    """What the BM25 path searches: the query's content words. "what", "did", "the" match most records
    and would make FTS5 score nearly the whole store for every query."""
    return " ".join(content_words(query)) or query


_PRESENT = re.compile(
    r"\b(?:now|currently|these days|nowadays|at the moment|at present|any ?more|still|right now|today)\b",
    re.I,
)


def asks_about_now(question: str) -> bool:
    """Whether a question asks how things are now ("Where does Ann live now?", "What does she do these
    days?"): the newest telling of an attribute is what answers it."""
    return _PRESENT.search(question) is not None


def parse_query_rules(question: str, reference_date: str | None = None) -> dict:
    """A `parse_query` answer (records.QueryParse) built by rules."""
    reference = datetime.fromisoformat(reference_date).date() if reference_date else date.today()
    lowered = question.lower()
    types = [
        t
        for t, cues in (("profile", PROFILE_CUES), ("episodic", EPISODIC_CUES))
        if any(re.search(rf"\b{c}\b", lowered) for c in cues)
    ]
    keywords = content_words(question)
    return {
        "target_types": types or list(MEMORY_TYPES),
        "time": parse_time(question, reference),
        "location": parse_location(question),
        "keywords": keywords or [question.strip()[:40] or "memory"],
        "need_assistant_context": any(cue in lowered for cue in ASSISTANT_CUES),
    }


class ModelQueryParser:
    """Parses with the model; an unavailable endpoint or an invalid answer falls back to the rules."""

    def __init__(self, client: ModelClient, speakers: list[str] | None = None):
        self.client, self.speakers, self.stats = client, speakers, Counter()

    def __call__(self, question: str, reference_date: str | None = None) -> dict:
        try:
            value = self.client.json(
                "parse_query", parse_query_messages(question, reference_date, self.speakers)
            )
            if validate("parse_query", value).ok:
                self.stats["model"] += 1
                return value
            self.stats["invalid"] += 1
        except ModelError:
            self.stats["unavailable"] += 1
        return parse_query_rules(question, reference_date)
