"""Result lines of a batch job: written in input order and durably, read back to resume.

One result line per input line: ``{"id", "line", "text", "finish_reason", "usage", "speculation"}``
(an answer made of calls of the line's tools also ``tool_calls``, finish_reason ``tool_calls``) or
``{"id", "line", "error"}``. Results finish in any order (requests run concurrently) but a result
is written only once every earlier line's result is written, and each write is flushed and
fsync'd: a killed job loses at most the results after its first unfinished line, and the file is
always a prefix of the input's results that a rerun can extend.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cluster.outputs import RequestOutput
from deployments.batch_input import BatchRequest, resume_key
from deployments.openai_responses import finish_reason_of, speculation_of, usage_of
from deployments.openai_tools import answer_calls, calls_finish_reason


def result_record(req: BatchRequest, out: RequestOutput) -> dict:
    if out.finish_reason == "error":
        return {"id": req.id, "line": req.line, "error": f"generation failed: {out.error}"}
    record = {"id": req.id, "line": req.line, "text": out.text, "finish_reason": finish_reason_of(out),
              "usage": usage_of(out), "speculation": speculation_of(out)}
    calls = answer_calls(out.text, req.tool_names, out.finish_reason)
    if calls:  # as HTTP chat answers them: the calls, finish_reason tool_calls unless cut (the text stays)
        record.update(finish_reason=calls_finish_reason(calls, record["finish_reason"]), tool_calls=calls)
    return record


def error_record(req: BatchRequest, err: Exception) -> dict:
    """A request the engine refused (prompt over the context, no chat template, ...)."""
    msg = str(err)
    return {"id": req.id, "line": req.line, "error": msg if msg.startswith(req.field) else f"{req.field}: {msg}"}


@dataclass(slots=True)
class ExistingResults:
    done: Counter = field(default_factory=Counter)  # resume key -> results already written
    num_lines: int = 0
    num_errors: int = 0
    valid_bytes: int = 0  # length of the file up to its last complete result line
    torn_line: bool = False  # bytes after valid_bytes: a line the job was killed while writing


def read_existing(path: Path) -> ExistingResults:
    """Results already in ``path`` (none when it does not exist); reads only. A torn last line (the
    job was killed mid-write) is not counted, so it is redone (``OrderedWriter`` cuts it off); any
    other line that is not a result line means the file is not this job's output: ValueError."""
    found = ExistingResults()
    if not path.exists():
        return found
    data = path.read_bytes()
    lines = data.split(b"\n")
    for k, raw in enumerate(lines[:-1], start=1):  # lines[-1]: bytes after the last newline
        rec = _parse_result(raw)
        if rec is None:
            if k == len(lines) - 1 and not lines[-1]:
                break  # the last line: torn
            raise ValueError(f"--output {str(path)!r}: line {k} is not a result line of a batch job; "
                             f"pass a new output file (or fix that line)")
        found.done[resume_key(rec.get("id"), rec["line"])] += 1
        found.num_lines += 1
        found.num_errors += "error" in rec
        found.valid_bytes += len(raw) + 1
    found.torn_line = found.valid_bytes < len(data)
    return found


def _parse_result(raw: bytes) -> dict | None:
    try:
        rec = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(rec, dict) and isinstance(rec.get("line"), int) and ("error" in rec or "text" in rec)
    return rec if ok else None


class OrderedWriter:
    """Holds finished results until every earlier one is in, then appends them, flushed and fsync'd.

    ``keep_bytes``: the file's valid prefix (``ExistingResults.valid_bytes``); a torn line after
    it is cut off. ``put(i, record)``: the result of the i-th line of this run (from 0);
    ``flush()`` writes the contiguous run that is complete and returns how many lines it wrote."""

    def __init__(self, path: Path, keep_bytes: int = 0):
        self.file = open(path, "a", encoding="utf-8")
        if self.file.tell() > keep_bytes:
            self.file.truncate(keep_bytes)
        self.pending: dict[int, dict] = {}
        self.next = 0
        self.num_written = 0
        self.num_errors = 0

    def put(self, index: int, record: dict) -> None:
        self.pending[index] = record

    def flush(self) -> int:
        lines = []
        while self.next in self.pending:
            rec = self.pending.pop(self.next)
            self.next += 1
            self.num_errors += "error" in rec
            lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
        if lines:
            self.file.write("".join(lines))
            self.file.flush()
            os.fsync(self.file.fileno())
            self.num_written += len(lines)
        return len(lines)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "OrderedWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
