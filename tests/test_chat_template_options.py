"""Chat template options (vLLM's extensions) through the official `openai` client, over the same
in-process app as tests/test_openai_conformance.py: ``continue_final_message`` (an assistant
prefill the answer continues), ``add_generation_prompt`` and chat ``echo``."""
from __future__ import annotations

import openai
import pytest

from tests.openai_examples import MODEL
from tests.test_openai_conformance import _call, app  # noqa: F401  (app: the module's fixture)


def test_the_answer_continues_the_assistant_message(app, default_model):  # noqa: F811 (the imported fixture)
    """vLLM's chat template options: continue_final_message renders the last (assistant) message
    open and the answer continues it, as a completion of the same tokens does; echo puts that
    message's start before the content; add_generation_prompt false opens no assistant turn."""
    messages = [{"role": "user", "content": "Name three colors."}, {"role": "assistant", "content": "Red, green"}]
    cont = {"add_generation_prompt": False, "continue_final_message": True}
    ids = default_model.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False,
                                                      continue_final_message=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    async def fn(client):
        kw = dict(model=MODEL, messages=messages, max_tokens=6, temperature=0)
        same = await client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
        answer = await client.chat.completions.create(**kw, extra_body=cont)
        echoed = await client.chat.completions.create(**kw, extra_body={**cont, "echo": True})
        stream = await client.chat.completions.create(**kw, extra_body={**cont, "echo": True}, stream=True)
        closed = await client.chat.completions.create(**kw)  # the default: the message closed, a new turn
        bare = await client.chat.completions.create(**{**kw, "messages": messages[:1]},
                                                    extra_body={"add_generation_prompt": False})
        opened = await client.chat.completions.create(**{**kw, "messages": messages[:1]})
        return same, answer, echoed, [c async for c in stream], closed, bare, opened

    same, answer, echoed, chunks, closed, bare, opened = _call(app, fn)
    content = answer.choices[0].message.content
    assert content == same.choices[0].text and answer.usage.prompt_tokens == len(ids)
    assert echoed.choices[0].message.content == "Red, green" + content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Red, green" + content
    assert closed.usage.prompt_tokens > len(ids)  # the default closes the message and opens a turn
    assert bare.usage.prompt_tokens < opened.usage.prompt_tokens  # no "<|im_start|>assistant" header

    def bad(msgs, **extra):
        with pytest.raises(openai.BadRequestError) as e:
            _call(app, lambda c: c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2,
                                                           extra_body=extra))
        return e.value.body
    body = bad(messages, continue_final_message=True)  # add_generation_prompt left at true
    assert body["param"] == "continue_final_message" and "add_generation_prompt=false" in body["message"]
    body = bad(messages[:1], **cont)
    assert body["param"] == "continue_final_message" and "role 'user'" in body["message"]
