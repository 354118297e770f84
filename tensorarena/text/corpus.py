"""An embedded English corpus: sentences of the Python language reference that ships with Python.

`pydoc_data.topics.topics` holds the text `help()` shows for keywords and topics
(about 460 kB of prose, grammar and examples). Prose paragraphs are kept, grammar
rules, code, tables and headings dropped, and the prose split into sentences.
Nothing is downloaded; the exact sentences follow the Python version's docs.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

# A sentence ends at . ! or ? followed by space and a capital, quote or bracket;
# "e.g. x" and "i.e. x" do not end one, nor do common abbreviations.
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "Mr.", "Dr.", "No.")
_HEADING_RULE = re.compile(r"^[*=\-^~\"]{3,}$")
_CODE_HINTS = ("::=", ">>>", "...", "\t", "|")


def _paragraphs(text: str):
    """Prose paragraphs of one topic, each joined onto one line."""
    lines = text.split("\n")
    block: list[str] = []
    for i, line in enumerate(lines + [""]):
        stripped = line.strip()
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        # Indented lines are grammar, code or literal blocks; a line underlined by a rule is a heading.
        if not stripped or line.startswith((" ", "\t")) or _HEADING_RULE.match(stripped) or _HEADING_RULE.match(nxt):
            if block:
                yield " ".join(block)
                block = []
            continue
        block.append(stripped)


def _merge_abbreviations(parts: list[str]) -> list[str]:
    out: list[str] = []
    for part in parts:
        if out and out[-1].endswith(_ABBREVIATIONS):
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return out


def _clean(sentence: str, min_chars: int, max_chars: int) -> str | None:
    s = re.sub(r"\s+", " ", sentence).strip()
    if not (min_chars <= len(s) <= max_chars):
        return None
    if s[-1] not in ".!?" or not s[0].isupper():
        return None  # fragments: the paragraph ran into a code block or list
    if any(h in s for h in _CODE_HINTS) or s.count('"') % 2 or s.count("(") != s.count(")"):
        return None
    if sum(c.isalpha() for c in s) < 0.6 * len(s):
        return None
    if s.lower().startswith(("see also", "note:", "changed in version", "added in version", "new in version",
                             "deprecated since")):
        return None
    return s


@lru_cache(maxsize=8)
def _sentences(min_chars: int, max_chars: int) -> tuple[str, ...]:
    from pydoc_data.topics import topics

    seen: set[str] = set()
    out: list[str] = []
    for key in sorted(topics):  # sorted: the order never depends on the dict's
        for paragraph in _paragraphs(topics[key]):
            for part in _merge_abbreviations(_SPLIT.split(paragraph)):
                s = _clean(part, min_chars, max_chars)
                if s is not None and s not in seen:
                    seen.add(s)
                    out.append(s)
    return tuple(out)


def python_reference_sentences(*, min_chars: int = 20, max_chars: int = 200, seed: int | None = None) -> list[str]:
    """Deduplicated prose sentences of Python's language reference (pydoc_data), in a fixed order.

    Args:
        min_chars, max_chars: inclusive bounds on a sentence's length in characters.
        seed: if given, the sentences come shuffled by np.random.default_rng(seed); same seed, same order.
    """
    if min_chars < 1 or max_chars < min_chars:
        raise ValueError(f"need 1 <= min_chars <= max_chars, got {min_chars} and {max_chars}")
    sentences = list(_sentences(min_chars, max_chars))
    if not sentences:
        # Two causes, two remedies: the bounds (most often) or an installation without the docs topics.
        from pydoc_data.topics import topics

        if not topics:
            raise RuntimeError("pydoc_data.topics is empty; this Python installation lacks its docs topics")
        raise ValueError(f"no sentence of the Python reference is between {min_chars} and {max_chars} characters "
                         f"long; widen the bounds (the defaults are 20 and 200)")
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(sentences))
        sentences = [sentences[i] for i in order]
    return sentences
