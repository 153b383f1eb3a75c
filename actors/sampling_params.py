"""Per-request sampling parameters, validated once at the edge (pydantic)."""
from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from actors.structured_output import StructuredOutput

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's cap for chat top_logprobs)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for one token's bias: [-100, 100]


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = no top-k filter")
    min_p: float = Field(0.0, ge=0.0, le=1.0,
                         description="vLLM: drop tokens below min_p x the most probable token's probability; 0 = off")
    seed: int | None = None
    max_tokens: int = Field(64, ge=1)  # generation also stops where the context ends (see LLMEngine.add_request)
    stop: tuple[str, ...] = ()
    # vLLM's stop_token_ids: generating one of these ends the request ("stop"); the token is in the
    # output ids, not in the text; min_tokens holds them back as it holds EOS
    stop_token_ids: tuple[int, ...] = ()
    # vLLM's include_stop_str_in_output: the text ends after the stop string (or the stop token's
    # text) that ended it, instead of before
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    # Speculation override for this request: None = engine policy, 0 = off, K = chain length.
    spec_tokens: int | None = Field(None, ge=0)
    # Log-probabilities of the emitted tokens (raw target distribution) plus this many alternatives
    # each; None = not computed (no cost).
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # The same for every prompt token after the first (vLLM's prompt_logprobs; the completions API's
    # echo): each prompt row's logits are computed, so the prompt is not served from the prefix cache.
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # SGLang's return_hidden_states: the final output carries the target's final-normed hidden state
    # of every position but the last (what a draft head is trained on); like prompt_logprobs, every
    # prompt row is computed (no prefix-cache hits). Engine API only: not offered over HTTP.
    return_hidden_states: bool = False
    # Logits processing (actors.logits_processing), applied to the target's logits of every tree node
    # given that node's own path, so speculation stays lossless. Neutral values cost nothing.
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="OpenAI: minus this once per token generated")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="OpenAI: minus this per time generated")
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False,
                                      description="vLLM/CTRL: logits of seen tokens divided (> 0) or multiplied by it")
    logit_bias: tuple[tuple[int, float], ...] = Field((), description="(token id, bias) pairs, from {id: bias}")
    min_tokens: int = Field(0, ge=0, description="EOS is masked until this many tokens are generated")
    # OpenAI's predicted outputs: text (or its token ids) the answer is expected to repeat, such as a
    # file being edited. Prompt lookup drafts from it as from the prompt; the output is the target's
    # own either way. Text is tokenized by the engine (LLMEngine.add_request), which passes ids on.
    prediction: str | tuple[int, ...] | None = None
    # Structured output (OpenAI's response_format json_object / json_schema; regex, Lark grammar and
    # choice as extensions): every row is masked to what the grammar allows after its path
    # (actors.structured_output), so the answer matches it and speculation stays lossless.
    structured: StructuredOutput | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_tuple(cls, v):
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        return tuple(v)

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_ids(cls, v):
        if v is None:
            return ()
        if not isinstance(v, (list, tuple)) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in v):
            raise ValueError("must be a list of token ids (non-negative integers)")
        return tuple(sorted(set(v)))

    @field_validator("prediction", mode="before")
    @classmethod
    def _prediction(cls, v):
        if v is None or isinstance(v, str):
            return v or None
        if not isinstance(v, (list, tuple)) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in v):
            raise ValueError("must be text or a list of token ids (non-negative integers)")
        return tuple(v) or None

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_pairs(cls, v):
        """``{token_id: bias}`` (JSON keys are strings: ``{"50256": -100}``) -> sorted pairs."""
        if v is None:
            return ()
        pairs = list(v.items()) if isinstance(v, Mapping) else v
        if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise ValueError("must be an object {token id: bias}")
        out = {}
        for key, bias in pairs:
            is_id = (isinstance(key, int) and not isinstance(key, bool) and key >= 0) or (
                isinstance(key, str) and key.strip().isdigit())
            if not is_id:
                raise ValueError(f"key {key!r} is not a token id (a non-negative integer)")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"bias {bias!r} of token {key}: must be a number in [-100, 100]")
            out[int(key)] = float(bias)
        return tuple(sorted(out.items()))

    @field_validator("min_tokens")
    @classmethod
    def _min_below_max(cls, v: int, info: ValidationInfo):
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and v > max_tokens:
            raise ValueError(f"must be at most max_tokens={max_tokens}")
        return v

    @model_validator(mode="after")
    def _structured_ends_at_eos(self) -> SamplingParams:
        """A grammar ends the answer with EOS once it is complete: ignore_eos and min_tokens, which
        hold EOS back, would leave it nothing to produce."""
        if self.structured is not None:
            if self.ignore_eos:
                raise ValueError(f"ignore_eos=true cannot be combined with structured output "
                                 f"({self.structured.kind}): the answer ends with EOS when the grammar is complete")
            if self.min_tokens:
                raise ValueError(f"min_tokens={self.min_tokens} cannot be combined with structured output "
                                 f"({self.structured.kind}): the grammar decides where the answer ends")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def deterministic(self) -> bool:
        """Each token is fixed by the target's distribution alone (greedy, or the seed's race), so
        verification needs no draft probabilities and a draft may offer several candidates per
        position (a dynamic tree); unseeded sampling needs independent draws from q (chains)."""
        return self.greedy or self.seed is not None

    @property
    def prediction_ids(self) -> tuple[int, ...]:
        """The prediction's token ids (empty: none, or text the engine has not tokenized yet)."""
        return self.prediction if isinstance(self.prediction, tuple) else ()

    @property
    def penalizes(self) -> bool:
        """Whether actors.logits_processing changes the logits (penalties, bias, min_tokens)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)

    @property
    def processes_logits(self) -> bool:
        """Whether any logits processing applies (penalties, bias, min_tokens, a grammar)."""
        return self.penalizes or self.structured is not None
