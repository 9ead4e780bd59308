"""The lexical analyzer, one definition for both store backends and every query: which text of a record
is indexed and how text is cut into terms (`LexicalIndex` scores them by BM25)."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

from dimmem.contract.records import DIMENSIONS

_TOKEN = re.compile(r"[^\W_]+")
_STOPWORDS = """
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we
were what when where which while who whom why will with would you your yours yourself yourselves
"""
STOPWORDS = frozenset(_STOPWORDS.split())


@cache
def _stemmer():
    import Stemmer  # PyStemmer: the Snowball English stemmer (PostgreSQL's 'english' uses the same)

    return Stemmer.Stemmer("english")


def terms(text: str) -> Counter[str]:
    """The indexed terms of a text with their counts: casefolded words of two or more characters, English
    stop words dropped, Snowball-stemmed (so "hiking" finds "hikes")."""
    words = [w for w in _TOKEN.findall(text.casefold()) if len(w) > 1 and w not in STOPWORDS]
    return Counter(_stemmer().stemWords(words))


# A record's indexed text: what the memory is about (content, the free-text dimensions, keywords); not
# who said it, its type, its time (the dimension path's) or its pointer
FIELDS: tuple[str, ...] = ("content", *DIMENSIONS, "keywords")


def document(record: dict) -> Counter[str]:
    """A record's indexed terms, of its `FIELDS` (lists joined)."""
    values = (record.get(field) for field in FIELDS)
    return terms(" ".join(" ".join(v) if isinstance(v, list) else v or "" for v in values))
