"""Traffic classes: per-request speculation rules on top of the adaptive policy.

Speculation does not pay for every request alike (the operator's playbook, phase 5): short outputs
spend a larger share on drafting than they gain, high temperatures accept little, and a busy batch
is compute-bound. A ``TrafficClass`` matches a request by what is known when it is scheduled:

- expected output length: the request's ``max_tokens`` (``max_tokens_below`` / ``max_tokens_at_least``);
- sampling temperature (``temperature_above`` / ``temperature_at_most``; 0 = greedy);
- concurrency: sequences running in the engine when the step is scheduled (``running_above`` /
  ``running_at_most``).

Conditions left out always hold; a class with none catches every request (put it last). The first
class whose conditions all hold decides, per step, how the request speculates: ``on`` (as configured:
the adaptive policy or the fixed K / tree), ``off`` (no draft slots are reserved for it) or a number
K (at most K draft depths; 0 = off). No class matching: as configured. The classes cap what the
adaptive policy may choose; they never force drafts it would not choose.

Not covered: the route (endpoint) of a request. ``SamplingParams`` does not carry it (the ingress
does not pass it to the engine), so no class can match on it. Requests that fix their own K
(``SamplingParams.spec_tokens``, e.g. benchmarks) are outside the classes.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_K = 64  # as SpeculativeConfig.num_spec_tokens


class TrafficClass(BaseModel):
    """One rule: its conditions and what matching requests get (``speculation``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    max_tokens_below: int | None = Field(None, ge=1)
    max_tokens_at_least: int | None = Field(None, ge=1)
    temperature_above: float | None = Field(None, ge=0.0)
    temperature_at_most: float | None = Field(None, ge=0.0)
    running_above: int | None = Field(None, ge=0)
    running_at_most: int | None = Field(None, ge=0)
    speculation: Literal["on", "off"] | int

    @field_validator("speculation", mode="before")
    @classmethod
    def _speculation(cls, v):
        if isinstance(v, bool):  # YAML 1.1 reads a bare on/off as true/false
            return "on" if v else "off"
        if isinstance(v, str) and v.strip().lower() in ("on", "off"):
            return v.strip().lower()
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v.strip())
        if isinstance(v, int) and 0 <= v <= MAX_K:
            return v
        raise ValueError(f"speculation={v!r}: expected on, off or a number of draft tokens K (0..{MAX_K})")

    @model_validator(mode="after")
    def _satisfiable(self):
        for low, high in (("max_tokens_at_least", "max_tokens_below"), ("temperature_above", "temperature_at_most"),
                          ("running_above", "running_at_most")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo >= hi:
                raise ValueError(f"traffic class {self.name!r}: {low}={lo} and {high}={hi} match no request")
        return self

    @property
    def max_depth(self) -> int | None:
        """The cap on draft depths for matching requests: None = as configured, 0 = off."""
        return None if self.speculation == "on" else 0 if self.speculation == "off" else self.speculation

    def matches(self, max_tokens: int, temperature: float, num_running: int) -> bool:
        return (_below(max_tokens, self.max_tokens_below) and _at_least(max_tokens, self.max_tokens_at_least)
                and _above(temperature, self.temperature_above) and _at_most(temperature, self.temperature_at_most)
                and _above(num_running, self.running_above) and _at_most(num_running, self.running_at_most))


def _below(x, limit) -> bool:
    return limit is None or x < limit


def _at_least(x, limit) -> bool:
    return limit is None or x >= limit


def _above(x, limit) -> bool:
    return limit is None or x > limit


def _at_most(x, limit) -> bool:
    return limit is None or x <= limit


def _unique_names(classes: list[TrafficClass]) -> list[TrafficClass]:
    seen = set()
    for c in classes:
        if c.name in seen:
            raise ValueError(f"traffic class name {c.name!r} is used twice; give each class its own name")
        seen.add(c.name)
    return classes


TrafficClasses = Annotated[list[TrafficClass], AfterValidator(_unique_names)]


def match(classes: list[TrafficClass], max_tokens: int, temperature: float, num_running: int) -> TrafficClass | None:
    """The first class matching a request of ``max_tokens`` at ``temperature`` with ``num_running``
    sequences running, or None."""
    return next((c for c in classes if c.matches(max_tokens, temperature, num_running)), None)
