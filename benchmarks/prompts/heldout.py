"""A held-out prompt set the draft's training never sees (issue 29), written by the target itself.

Magpie-style: the target model is given its chat template up to the start of a user turn plus a
short opener naming the request type (and a topic), and samples the rest of the user's request.
The topics are the short descriptions of the Debian packages installed on the generating machine
(``/var/lib/dpkg/status``): a source neither the training mix (its own templates, vocabulary words,
Python docstrings: ``training/prompt_mix.py``) nor bench500 uses. Six categories as in bench500,
each prompt with its own ``max_tokens``.

    python -m benchmarks.prompts.heldout --out benchmarks/prompts/heldout_magpie.jsonl [--per-category 4]

The committed file is what the benchmarks read; it is generated once (sampling on this machine's
CPU), not rebuilt by the tests. ``tests/test_prompt_set.py`` keeps it apart from the training mix.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

# category -> (openers; {topic} is filled in), max_tokens of the answers
CATEGORIES = {
    "short_qa": (("In one or two sentences, what is {topic}?", "Quick question about {topic}:",
                  "Why would someone use {topic}?"), 64),
    "translation": (("Translate this into French: {topic} is", "Translate into Korean: Please install {topic}",
                     "Translate into German: The {topic}"), 96),
    "summarization": (("Summarize the following text about {topic} in two sentences:\n\n",
                       "Give a short summary of this note on {topic}:\n\n"), 128),
    "code_generation": (("Write a Python function that uses {topic} to", "Write a shell script that checks {topic}",
                         "In Python, how do I parse {topic}"), 160),
    "structured_output": (("Return a JSON object describing {topic} with the keys",
                           "Output YAML for a config of {topic} with"), 128),
    "creative_writing": (("Write a short poem about {topic}", "Write a very short story in which {topic}"), 160),
}


def debian_topics(path: str = "/var/lib/dpkg/status") -> list[str]:
    """Short package descriptions (lower-cased, 2-8 words), deduplicated, in file order."""
    seen, out = set(), []
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith("Description: "):
            text = line.removeprefix("Description: ").strip().rstrip(".")
            words = text.split()
            if 2 <= len(words) <= 8 and re.fullmatch(r"[A-Za-z0-9 ,'()+/.-]+", text):
                t = text[0].lower() + text[1:]
                if t not in seen:
                    seen.add(t)
                    out.append(t)
    return out


def generate(engine, per_category: int, seed: int) -> list[dict]:
    from actors.sampling_params import SamplingParams
    from training.magpie import clean_request, user_turn_prefix

    rng = random.Random(seed)
    topics = debian_topics()
    rng.shuffle(topics)
    prefix = user_turn_prefix(engine.tokenizer)
    out, t = [], 0
    for category, (openers, budget) in CATEGORIES.items():
        made, tries = 0, 0
        while made < per_category and tries < 6 * per_category:
            opener = openers[tries % len(openers)].format(topic=topics[t % len(topics)])
            t, tries = t + 1, tries + 1
            ids = prefix + engine.tokenizer.encode(opener, add_special_tokens=False)
            params = SamplingParams(max_tokens=80, temperature=1.0, top_p=0.95, seed=seed * 1000 + t,
                                    stop=["<|im_end|>", "<|im_start|>"])
            text = clean_request(opener, engine.generate([ids], params)[0].text, min_words=6)
            if text is not None:
                made += 1
                out.append({"id": f"heldout-{category}-{made}", "category": category,
                            "messages": [{"role": "user", "content": text}], "max_tokens": budget})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.prompts.heldout", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "heldout_magpie.jsonl")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--seed", type=int, default=29)
    args = ap.parse_args(argv)
    from cluster.config import EngineConfig
    from cluster.engine import LLMEngine

    engine = LLMEngine(EngineConfig(num_threads=2))
    rows = generate(engine, args.per_category, args.seed)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
