"""Offline batch generation: a JSONL file of prompts in, a JSONL file of results out, as a Ray job.

    ray job submit --working-dir . -- python -m deployments.batch \\
        --input /data/in.jsonl --output /data/out.jsonl [--model smollm2-135m] [--draft ngram] \\
        [--spec-tokens K] [--concurrency N] [--max-tokens N] [--progress-every SECONDS]

(``--working-dir .`` uploads the checkout, minus what .gitignore lists, such as .venv; the job runs
in it, so ``python -m deployments.batch`` finds the project. Paths are the node's: use absolute
paths on storage the head node sees. It also runs without Ray: ``python -m deployments.batch ...``.)

Input lines: ``{"id": ..., "prompt": "..."}`` or ``{"id": ..., "messages": [...]}`` with optional
max_tokens, temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, include_stop_str_in_output,
spec_tokens, ignore_eos (see batch_input).
Output: one line per input line, in input order (see batch_output); a bad input line gets an
error line naming the field and value, and the job goes on. Requests run through the in-process
engine as one continuous batch of at most --concurrency. Rerunning with the same --output resumes:
lines whose results are already there are skipped. Progress goes to stdout (the job's logs) every
--progress-every seconds and at the end. Bad arguments: one line on stderr, exit code 2, before the
model loads.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pydantic import ValidationError

from cluster.cli import EXIT_BAD_INPUT, BadInput, add_engine_args, engine_config_from_args
from cluster.outputs import RequestOutput
from cluster.prompt_file import count_lines
from deployments.batch_input import BatchRequest, LineError, LineReader
from deployments.batch_output import ExistingResults, OrderedWriter, error_record, read_existing, result_record

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


@dataclass(slots=True)
class BatchSummary:
    total: int  # non-blank input lines
    skipped: int  # input lines whose results were already in the output (resume)
    written: int  # result lines this run wrote
    errors: int  # error lines in the output, old and new
    output_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    elapsed_s: float = 0.0

    @property
    def done(self) -> int:
        return self.skipped + self.written

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    def line(self) -> str:
        rate = "n/a" if self.acceptance_rate is None else f"{self.acceptance_rate:.3f}"
        return (f"{self.done}/{self.total} done, {self.errors} errors, {self.skipped} skipped (already in output), "
                f"{self.tokens_per_s:.1f} output tok/s, acceptance rate {rate}")


class Progress:
    """Counts what this run produced and reports a line every ``every_s`` seconds."""

    def __init__(self, summary: BatchSummary, every_s: float, log: Log):
        self.summary, self.every_s, self.log = summary, every_s, log
        self.old_errors = summary.errors  # error lines already in the output
        self.start = self.last = time.monotonic()

    def finished(self, out: RequestOutput) -> None:
        s = self.summary
        s.output_tokens += out.num_output_tokens
        s.draft_tokens += out.num_draft_tokens
        s.accepted_tokens += out.num_accepted_tokens

    def update(self, writer: OrderedWriter, final: bool = False) -> None:
        now = time.monotonic()
        s = self.summary
        s.written, s.elapsed_s = writer.num_written, now - self.start
        s.errors = self.old_errors + writer.num_errors
        if final or now - self.last >= self.every_s:
            self.last = now
            self.log(f"batch: {'finished: ' if final else ''}{s.line()}")


@dataclass
class BatchJob:
    input_path: Path
    output_path: Path
    concurrency: int = 16
    max_tokens: int = 64
    progress_every_s: float = 5.0

    def check(self) -> ExistingResults:
        """Validate the paths and knobs and read what the output already holds (cheap, changes
        nothing: run it before any model loads). Raises BadInput / ValueError naming the bad value."""
        inp, outp = self.input_path, self.output_path
        if not inp.is_file():
            raise BadInput(f"--input {str(inp)!r}: {'is a directory' if inp.is_dir() else 'no such file'}")
        if not outp.parent.is_dir():
            raise BadInput(f"--output {str(outp)!r}: directory {str(outp.parent)!r} does not exist")
        if outp.is_dir():
            raise BadInput(f"--output {str(outp)!r}: is a directory; give a file path")
        if outp.exists() and outp.samefile(inp):
            raise BadInput(f"--output {str(outp)!r}: is the input file; give another path")
        for name, v in (("concurrency", self.concurrency), ("max-tokens", self.max_tokens)):
            if v < 1:
                raise BadInput(f"--{name} {v}: must be at least 1")
        if not self.progress_every_s > 0:
            raise BadInput(f"--progress-every {self.progress_every_s}: must be a positive number of seconds")
        return read_existing(outp)

    def run(self, engine, log: Log = _print) -> BatchSummary:
        """Generate every line not already in the output; returns the counts of this run."""
        existing = self.check()
        if existing.torn_line:
            log(f"batch: dropping a torn last line of {self.output_path} (it is redone)")
        summary = BatchSummary(total=count_lines(self.input_path), skipped=existing.num_lines, written=0,
                               errors=existing.num_errors)
        reader = LineReader(self.input_path, existing.done, self.max_tokens)
        progress = Progress(summary, self.progress_every_s, log)
        if existing.num_lines:
            log(f"batch: resuming: {existing.num_lines} results already in {self.output_path}")
        with OrderedWriter(self.output_path, existing.valid_bytes) as writer:
            _serve(engine, reader, writer, self.concurrency, progress)
        summary.skipped = reader.num_skipped
        progress.update(writer, final=True)
        return summary


def _serve(engine, items: Iterable[BatchRequest | LineError], writer: OrderedWriter, concurrency: int,
           progress: Progress) -> None:
    """One continuous batch of at most ``concurrency`` requests; results go to ``writer`` in order."""
    inflight: dict[str, tuple[int, BatchRequest]] = {}
    todo = enumerate(items)
    exhausted = False
    while True:
        while not exhausted and len(inflight) < concurrency:
            nxt = next(todo, None)
            if nxt is None:
                exhausted = True
            elif isinstance(nxt[1], LineError):
                writer.put(nxt[0], nxt[1].record())
            else:
                i, req = nxt
                rid = f"batch-{i}"
                try:
                    engine.add_request(rid, req.prompt, req.params)
                    inflight[rid] = (i, req)
                except ValueError as e:  # prompt over the context, no chat template, ...
                    writer.put(i, error_record(req, e))
        if not inflight:
            break
        for out in engine.step():
            if out.finished:
                i, req = inflight.pop(out.request_id)
                writer.put(i, result_record(req, out))
                progress.finished(out)
        writer.flush()
        progress.update(writer)
    writer.flush()
    engine.on_idle()


# ---- command line -----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line (not argparse's usage block): the job logs show exactly what was wrong."""
        print(f"batch: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m deployments.batch",
                description="batch generation: JSONL prompts in, JSONL results out (resumable)")
    p.add_argument("--input", required=True, help="JSONL: {id, prompt | messages, optional sampling fields}")
    p.add_argument("--output", required=True, help="JSONL results; an existing file is resumed")
    add_engine_args(p)
    p.add_argument("--concurrency", type=int, default=16, help="at most N requests in flight")
    p.add_argument("--max-tokens", type=int, default=64, help="default for lines without max_tokens")
    p.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS")
    return p


def _check_model_arg(flag: str, spec: str) -> None:
    """A model alias (its package installed) or an existing path; checked before anything loads."""
    from actors.model.registry import is_alias, resolve_alias

    if is_alias(spec):
        resolve_alias(spec)
    elif not Path(spec).exists():
        hint = " (or none | ngram | layerskip:N | default | eagle | eagle:PATH | default:PATH)" if flag == "--draft" else ""
        raise BadInput(f"{flag} {spec!r}: no such model alias, file or directory{hint}")


def prepare(args: argparse.Namespace):
    """Everything that can fail on bad arguments, before the model loads: (job, engine config)."""
    job = BatchJob(Path(args.input), Path(args.output), args.concurrency, args.max_tokens, args.progress_every)
    job.check()
    config = engine_config_from_args(args)
    _check_model_arg("--model", config.model)
    if config.speculative.method == "draft":
        _check_model_arg("--draft", config.speculative.draft_model)
    if config.max_num_seqs < job.concurrency:
        config = config.model_copy(update={"max_num_seqs": job.concurrency})
    return job, config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        job, config = prepare(args)
        from cluster.engine import LLMEngine

        _print(f"batch: loading {config.model} (speculation: {config.speculative.method})")
        engine = LLMEngine(config)
    except ValidationError as e:
        from cluster.validation import format_validation_error

        print(f"batch: error: {format_validation_error(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (BadInput, ValueError, OSError) as e:  # OSError: e.g. an unreadable --input or --output
        print(f"batch: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job.run(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
