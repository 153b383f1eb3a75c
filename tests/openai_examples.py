"""Example values of OpenAI request fields that the conformance tests send (tests/test_openai_fields.py
against the request models, tests/test_openai_conformance.py through the official client)."""
from __future__ import annotations

MODEL = "smollm2-135m"
CONTEXT = 256  # the tests' context length: overflow cases stay cheap
MESSAGES = [{"role": "user", "content": "Name three colours."}]

# Values that ask for something this server cannot do, per rejected top-level field.
REJECTED = {
    "functions": [{"name": "f"}], "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"],
    "web_search_options": {}, "reasoning_effort": "high",
    "verbosity": "low", "moderation": {"model": "omni-moderation-latest"},
    "suffix": "!", "best_of": 2,
}
NEUTRAL = {"functions": [], "function_call": "none", "modalities": ["text"],
           "reasoning_effort": "none", "verbosity": "medium", "suffix": "",
           "best_of": 1}
IGNORED = {"user": "u-1", "safety_identifier": "s-1", "metadata": {"k": "v"}, "store": True, "service_tier": "auto",
           "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "1h"}}
