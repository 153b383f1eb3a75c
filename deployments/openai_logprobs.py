"""The engine's per-token logprobs (``actors.logprobs.TokenLogprob``) in OpenAI's response shapes.

Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``,
where each top dict holds the k alternatives plus the chosen token (up to k + 1 entries, as OpenAI).
Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": None}``. Streaming chunks carry the same shapes for their own tokens. A token's text is
its own decoding (a piece of a multi-byte character decodes to U+FFFD, as in vLLM); ``bytes`` are
that text's UTF-8 bytes. gRPC (``by_id``): each token's id, text and logprob, with its alternatives'.
"""
from __future__ import annotations

from actors.logprobs import TokenLogprob

_FLOOR = -9999.0  # JSON has no -inf: a token the model rules out gets this (as vLLM)


class LogprobFormatter:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}

    def token(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id])
        return text

    def completion(self, entries: list[TokenLogprob], offset: int = 0) -> tuple[dict, int]:
        """The completions ``logprobs`` object for ``entries`` whose text starts at character
        ``offset`` of the choice's text; also the offset after them (for the next chunk)."""
        tokens, offsets = [], []
        for e in entries:
            tokens.append(self.token(e.token_id))
            offsets.append(offset)
            offset += len(tokens[-1])
        tops = [{**{self.token(t): _value(v) for t, v in e.top}, tok: _value(e.logprob)}
                for e, tok in zip(entries, tokens)]
        body = {"tokens": tokens, "token_logprobs": [_value(e.logprob) for e in entries],
                "top_logprobs": tops, "text_offset": offsets}
        return body, offset

    def echoed(self, prompt_ids: list[int], prompt_entries: list[TokenLogprob],
               entries: list[TokenLogprob]) -> tuple[dict, int]:
        """The completions ``logprobs`` object of an echoed choice: every prompt token, the first with
        a null logprob and null alternatives (no row predicts it), ``prompt_entries`` for the others,
        then ``entries`` (the choice's own tokens so far); also the text offset after them."""
        first = self.token(prompt_ids[0])
        body = {"tokens": [first], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}
        offset = len(first)
        for part in (prompt_entries, entries):
            more, offset = self.completion(part, offset)
            body = {key: body[key] + more[key] for key in body}
        return body, offset

    def chat(self, entries: list[TokenLogprob]) -> dict:
        return {"content": [{**self._item(e.token_id, e.logprob),
                             "top_logprobs": [self._item(t, v) for t, v in e.top]} for e in entries],
                "refusal": None}

    def _item(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}

    def by_id(self, entries: list[TokenLogprob]) -> list[dict]:
        """gRPC's shape (``specray.v1.TokenLogprob``): ``{"token_id", "token", "logprob",
        "top_logprobs": [{"token_id", "token", "logprob"}]}`` per entry."""
        return [{**self._pair(e.token_id, e.logprob), "top_logprobs": [self._pair(t, v) for t, v in e.top]}
                for e in entries]

    def _pair(self, token_id: int, logprob: float) -> dict:
        return {"token_id": token_id, "token": self.token(token_id), "logprob": _value(logprob)}


def _value(logprob: float) -> float:
    return max(logprob, _FLOOR)
