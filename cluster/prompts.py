"""Prompt encoding (text, chat messages or token ids) and the checks every prompt passes."""
from __future__ import annotations

from cluster.request import RequestError


class PromptEncoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """prompt: str, list of {"role", "content"} messages (chat template), or list of token ids."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            return self.apply_chat_template(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, str):
            ids = (self.apply_chat_template([{"role": "user", "content": prompt}]) if chat
                   else self.tokenizer.encode(prompt, add_special_tokens=False))
        else:
            raise ValueError(f"prompt must be a string, a list of chat messages or a list of token ids, "
                             f"got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        return ids

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False) -> list[int]:
        """Token ids of ``messages`` under the model's chat template: by default with an assistant
        turn opened after them; ``continue_final_message``: ending inside the last message, which
        the answer continues (transformers' options of the same names)."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] must be an object with 'role' and 'content', got {m!r}")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
        extra = {"continue_final_message": True} if continue_final_message else {}
        out = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                 **extra)
        ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
        return list(ids)

    def check_length(self, ids: list[int], max_model_len: int, vocab_size: int, max_tokens: int | None = None) -> None:
        """The prompt fits the context (with ``max_tokens`` more tokens when given: a request that
        named max_tokens is refused rather than cut short) and its ids are in the vocabulary."""
        if len(ids) >= max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens but the model's context is {max_model_len} "
                             f"tokens: the prompt must be at most {max_model_len - 1} tokens")
        if max_tokens is not None and len(ids) + max_tokens > max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens and max_tokens={max_tokens}: {len(ids) + max_tokens} "
                             f"tokens, more than the model's context of {max_model_len} tokens; ask for at most "
                             f"max_tokens={max_model_len - len(ids)}, or leave max_tokens out to generate until "
                             f"the context ends")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")

    def encode_prediction(self, params, max_model_len: int):
        """``params`` with a text ``prediction`` replaced by its token ids (no special tokens), which
        ``check_params`` then checks; a prediction longer than the context is refused."""
        if isinstance(params.prediction, str):
            params = params.model_copy(update={"prediction": tuple(
                self.tokenizer.encode(params.prediction, add_special_tokens=False)) or None})
        n = len(params.prediction_ids)
        if n > max_model_len:
            raise RequestError(f"prediction has {n} tokens, more than the model's context of {max_model_len} "
                               "tokens", "prediction")
        return params

    @staticmethod
    def grammar_state(compiler, params):
        """The request's grammar state (``actors.structured_output``), None without structured output;
        a grammar the compiler refuses is a RequestError naming response_format."""
        if params.structured is None:
            return None
        try:
            return compiler.state(params.structured)
        except ValueError as e:
            raise RequestError(f"response_format ({params.structured.kind}): {e}", "response_format") from None

    @staticmethod
    def check_params(params, vocab_size: int) -> None:
        """Token ids inside the sampling parameters (``logit_bias``, ``stop_token_ids``, a tokenized
        ``prediction``) are in the vocabulary."""
        for field, ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids),
                           ("prediction", params.prediction_ids)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise RequestError(f"{field}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})", field)


def eos_ids(model_config, tokenizer) -> set[int]:
    """Token ids that end generation: the model config's eos_token_id (an int or a list) and the
    tokenizer's."""
    ids = set()
    for v in (getattr(model_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids
