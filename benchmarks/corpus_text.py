"""A deterministic corpus of varied English text (seed 0) for benchmarks: documents of
`min_words`–`max_words` words (about 64–512 WordPiece tokens with the defaults), built
from sentences with varied vocabulary, punctuation, numbers and casing, so that
tokenization costs what real text costs (texts made of one repeated word cost the
tokenizer almost nothing)."""

from __future__ import annotations

import numpy as np

_SUBJECTS = [
    "The committee",
    "A researcher at the institute",
    "Our team",
    "The new policy",
    "Most customers",
    "The city council",
    "An independent audit",
    "The software update",
    "This approach",
    "Early results",
    "The second quarter",
    "A recent survey",
    "Engineers in Munich",
    "The museum's collection",
    "Farmers across the region",
]
_VERBS = [
    "reported",
    "suggested",
    "reduced",
    "improved",
    "questioned",
    "announced",
    "measured",
    "described",
    "compared",
    "delayed",
    "approved",
    "documented",
    "rejected",
    "estimated",
]
_OBJECTS = [
    "the cost of maintenance",
    "a significant increase in latency",
    "the proposal",
    "several unexpected side effects",
    "the annual budget",
    "an alternative design",
    "the water quality downstream",
    "throughput on the evening shift",
    "energy prices",
    "the accuracy of the forecast",
    "a backlog of unresolved tickets",
    "customer retention",
    "the structural integrity of the bridge",
    "vaccination rates among adults",
]
_TAILS = [
    "after months of debate",
    "despite strong objections",
    "according to preliminary data",
    "for the third year in a row",
    "in a statement on Tuesday",
    "by roughly 14 percent",
    "without any public consultation",
    "as the deadline approached",
    "in most districts",
    "although the sample was small",
    "under the revised guidelines",
    "since early 2019",
]
_EXTRAS = [
    "Critics, however, remain unconvinced.",
    "Further analysis is planned for next spring.",
    "The findings were published in a peer-reviewed journal.",
    "Questions remain (see §4.2).",
    "Costs rose from $1.2M to $1.9M.",
    '"We expected this," one official said.',
    "It's unclear whether the trend will continue.",
    "Data: 3,412 respondents; margin ±2.1%.",
]


def sentence(rng: np.random.Generator) -> str:
    parts = [
        _SUBJECTS[rng.integers(len(_SUBJECTS))],
        _VERBS[rng.integers(len(_VERBS))],
        _OBJECTS[rng.integers(len(_OBJECTS))],
    ]
    if rng.random() < 0.7:
        parts.append(_TAILS[rng.integers(len(_TAILS))])
    text = " ".join(parts) + "."
    if rng.random() < 0.3:
        text += " " + _EXTRAS[rng.integers(len(_EXTRAS))]
    if rng.random() < 0.1:
        text += f" Ref. {rng.integers(100, 99999)}-{chr(65 + rng.integers(26))}."
    return text


def corpus(count: int, min_words: int = 52, max_words: int = 385, seed: int = 0) -> list[str]:
    """`count` documents; word counts uniform in [min_words, max_words]."""
    rng = np.random.default_rng(seed)
    docs = []
    for target in rng.integers(min_words, max_words + 1, size=count):
        words: list[str] = []
        while len(words) < target:
            words += sentence(rng).split()
        docs.append(" ".join(words[:target]))
    return docs
