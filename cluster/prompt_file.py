"""JSONL files of prompts: one JSON object per line, read the same way by every edge that takes them.

- ``json_lines(path)``: every non-blank line with its number (from 1), decoded, or why it is not
  JSON. The batch job reads its input so: a bad line becomes an error result and the job goes on.
- ``read_prompt_file(path, flag)``: the prompt lines of ``specray generate --prompts-file`` and of
  the benchmark prompt sets, each an object with ``prompt`` (text) or ``messages`` (chat). The first
  bad line, or an unreadable or empty file, is a ValueError naming the file and the line.

Lines are split on ``\\n`` only (a JSON string may hold U+2028, which ``str.splitlines`` would split).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


@dataclass(frozen=True, slots=True)
class JsonLine:
    number: int  # from 1, counting blank lines too
    value: Any = None
    error: str | None = None  # why the line is not JSON; then value is None


@dataclass(frozen=True, slots=True)
class PromptLine:
    number: int
    fields: dict  # the line's object: prompt or messages, optional max_tokens and the file's own keys

    @property
    def prompt(self) -> str | list | None:
        """The chat messages when the line has any, else its text prompt."""
        return self.fields.get("messages") or self.fields.get("prompt")


def nonblank_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, raw line) for every line with content; blank lines are not requests."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if raw.strip():
                yield n, raw


def count_lines(path: str | Path) -> int:
    return sum(1 for _ in nonblank_lines(path))


def json_lines(path: str | Path) -> Iterator[JsonLine]:
    for n, raw in nonblank_lines(path):
        try:
            yield JsonLine(n, json.loads(raw))
        except UnicodeDecodeError as e:
            yield JsonLine(n, error=f"line is not valid UTF-8 ({e.reason} at byte {e.start})")
        except json.JSONDecodeError as e:
            yield JsonLine(n, error=f"line is not valid JSON: {e.msg} at column {e.colno}")


def read_prompt_file(path: str | Path, flag: str) -> list[PromptLine]:
    """Every line of ``path`` as a PromptLine; ``flag`` is the option that named the file."""
    items = []
    try:
        for line in json_lines(path):
            where = f"{path}:{line.number}"
            if line.error is not None:
                raise ValueError(f"{where}: {line.error}")
            if not isinstance(line.value, dict) or not ({"prompt", "messages"} & line.value.keys()):
                raise ValueError(f"{where}: each line needs a 'prompt' or a 'messages' field")
            items.append(PromptLine(line.number, line.value))
    except OSError as e:
        raise ValueError(f"{flag} {str(path)!r}: {e.strerror or e}") from None
    if not items:
        raise ValueError(f"{flag} {str(path)!r} holds no prompts")
    return items
