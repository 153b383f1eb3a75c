"""Per-request sampling parameters, validated once at the edge (pydantic)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's cap for chat top_logprobs)


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = no top-k filter")
    seed: int | None = None
    max_tokens: int = Field(64, ge=1)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Speculation override for this request: None = engine policy, 0 = off, K = fixed chain length.
    spec_tokens: int | None = Field(None, ge=0)
    # Log-probabilities of the emitted tokens (raw target distribution) plus this many alternatives
    # each; None = not computed (no cost).
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_tuple(cls, v):
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        return tuple(v)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def deterministic(self) -> bool:
        """Each token is fixed by the target's distribution alone (greedy, or the seed's race), so
        verification needs no draft probabilities and a draft may offer several candidates per
        position (a dynamic tree); unseeded sampling needs independent draws from q (chains)."""
        return self.greedy or self.seed is not None
