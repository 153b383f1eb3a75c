"""What the `specray bench` tests share: the command run in-process, and a small prompt file."""
from __future__ import annotations

import json
from pathlib import Path

from cluster.cli import main

SHORT_PROMPTS = {
    "short_qa": ["What is 2+2?", "Name a primary color.", "What is the capital of France?", "Define gravity briefly."],
    "code_generation": ["Write a Python function that adds two numbers.", "Write a bash command to list files."],
    "translation": ["Translate to French: Good morning, my friend.", "Translate to German: The cat sleeps."],
}


def run_cli(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def write_prompts(path: Path) -> Path:
    """8 short chat prompts in 3 categories, the bench500 line shape, written to ``path``."""
    lines = [{"id": f"{c}-{i}", "category": c, "messages": [{"role": "user", "content": p}], "max_tokens": 64}
             for c, ps in SHORT_PROMPTS.items() for i, p in enumerate(ps)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path
