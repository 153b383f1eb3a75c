"""One line from a pydantic ValidationError: each bad field named, with its value and the rule it broke.

Every edge formats its validation errors here. Users of each edge already read one of three forms,
so the few rules that differ are declared as an ``ErrorStyle``:

- ``FLAGS`` (command-line flags, ``args:`` of a Serve application): ``max_num_seqs=0: Input should
  be ...``; a whole-object error is ``value: ...``; the value is not repeated for errors that the
  project's own validators raise (their message names it).
- ``CONFIG_FILE`` (keys of a Serve config file): ``applications[0].args.engine.modle`` as a key path,
  ``unknown key X`` for a typo, and no mapping or list repeated (the user has the file open).
- ``REQUEST`` (request bodies, batch lines, gRPC messages): ``messages.0.role='robot': ...``; FastAPI's
  ``body`` prefix left out; the value is repeated for every error except a missing field.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class ErrorStyle:
    brackets: bool = False  # list positions as applications[0] (else messages.0)
    whole: str = "value"  # the name of an error of the whole object (an empty location)
    quiet: frozenset[str] = frozenset({"value_error"})  # error types whose input is not repeated
    quiet_containers: bool = False  # never repeat a mapping or a list
    unknown_key: bool = False  # an extra key as "unknown key X" (else "X=value: Extra inputs ...")
    drop: tuple[str, ...] = ()  # location parts that are the transport's, not the user's


FLAGS = ErrorStyle()
CONFIG_FILE = ErrorStyle(brackets=True, whole="", quiet_containers=True, unknown_key=True)
REQUEST = ErrorStyle(whole="body", quiet=frozenset({"missing"}), drop=("body",))


def key_path(parts: Iterable[Any]) -> str:
    """``("applications", 0, "args")`` -> ``applications[0].args``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _errors(err: ValidationError | list[dict]) -> list[dict]:
    return err.errors() if isinstance(err, ValidationError) else list(err)


def _location(style: ErrorStyle, loc: Iterable[Any]) -> str:
    parts = [x for x in loc if x not in style.drop]
    return (key_path(parts) if style.brackets else ".".join(str(x) for x in parts)) or style.whole


def _shows_input(style: ErrorStyle, e: dict) -> bool:
    if "input" not in e or e["type"] in style.quiet:
        return False
    return not (style.quiet_containers and isinstance(e["input"], (dict, list)))


def format_validation_error(err: ValidationError | list[dict], style: ErrorStyle = FLAGS,
                            prefix: tuple = ()) -> str:
    """One line naming each bad field (``prefix``: where the validated object sits, e.g. in a file)."""
    parts = []
    for e in _errors(err):
        loc = _location(style, prefix + tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if style.unknown_key and e["type"] == "extra_forbidden":
            parts.append(f"unknown key {loc}")
        elif _shows_input(style, e):
            parts.append(f"{loc}={e['input']!r}: {msg}")
        else:
            parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def first_field(err: ValidationError | list[dict], style: ErrorStyle = REQUEST) -> str | None:
    """The top-level field of the first error (OpenAI's ``param``), None for a whole-object error."""
    errors = _errors(err)
    loc = [x for x in (errors[0]["loc"] if errors else ()) if x not in style.drop]
    return str(loc[0]) if loc else None
