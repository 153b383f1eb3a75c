"""Free local TCP ports for servers the tests start, and greedy in-process references for them."""
from __future__ import annotations

from benchmarks.ports import free_port  # noqa: F401  (re-exported for the tests)


def greedy_reference(loaded, config, prompt: str, messages: list[dict], max_tokens: int) -> dict:
    """What the in-process engine answers greedily for a completion and a chat prompt: the text a
    served endpoint (HTTP, gRPC) must reproduce."""
    from actors.sampling_params import SamplingParams
    from cluster.engine import LLMEngine

    eng = LLMEngine(config, loaded=loaded)
    params = SamplingParams(max_tokens=max_tokens)
    comp = eng.generate([prompt], params)[0]
    chat = eng.generate([messages], params, chat=True)[0]
    assert comp.num_output_tokens > 0 and chat.num_output_tokens > 0
    return {"completion": comp, "chat": chat}
