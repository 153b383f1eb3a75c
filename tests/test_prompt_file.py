"""The one JSONL prompt-file reader (cluster/prompt_file.py): batch input, --prompts-file, benchmark sets."""
from __future__ import annotations

import json

import pytest

from cluster.prompt_file import JsonLine, PromptLine, count_lines, json_lines, read_prompt_file

MESSAGES = [{"role": "user", "content": "hi"}]


def test_json_lines_numbers_every_line_and_says_why_one_is_not_json(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(b'{"a": 1}\n\n   \n[1, 2]\n{"b": 2\n{"c": "\xff"}\n"s\xe2\x80\xa8t"\n')
    assert list(json_lines(f)) == [
        JsonLine(1, {"a": 1}), JsonLine(4, [1, 2]),
        JsonLine(5, error="line is not valid JSON: Expecting ',' delimiter at column 1"),
        JsonLine(6, error="line is not valid UTF-8 (invalid start byte at byte 7)"),
        JsonLine(7, "s\u2028t"),  # split on newlines only: U+2028 inside a string stays
    ]
    assert count_lines(f) == 5


def test_read_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    lines = [{"prompt": "a"}, {"messages": MESSAGES, "max_tokens": 4, "category": "qa"},
             {"messages": [], "prompt": "fallback"}]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    got = read_prompt_file(f, "--prompts-file")
    assert got == [PromptLine(1, lines[0]), PromptLine(2, lines[1]), PromptLine(3, lines[2])]
    assert [p.prompt for p in got] == ["a", MESSAGES, "fallback"]  # messages first, else the text


@pytest.mark.parametrize("text, words", [
    ('{"prompt": "ok"}\n{not json}\n', "{f}:2: line is not valid JSON: Expecting property name enclosed in double "
                                       "quotes at column 2"),
    ('{"text": "no prompt"}\n', "{f}:1: each line needs a 'prompt' or a 'messages' field"),
    ('{"prompt": "a"}\n[1]\n', "{f}:2: each line needs a 'prompt' or a 'messages' field"),
    ("\n \n", "--flag '{f}' holds no prompts"),
])
def test_read_prompt_file_names_the_file_and_line(tmp_path, text, words):
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    with pytest.raises(ValueError) as e:
        read_prompt_file(f, "--flag")
    assert str(e.value) == words.format(f=f)


def test_read_prompt_file_unreadable(tmp_path):
    with pytest.raises(ValueError) as e:
        read_prompt_file(tmp_path / "nope.jsonl", "--prompts")
    assert str(e.value) == f"--prompts '{tmp_path / 'nope.jsonl'}': No such file or directory"


def test_the_benchmark_set_and_the_cli_read_through_it(tmp_path, capsys):
    from benchmarks.prompt_set import BenchPrompt, load_prompt_set
    from cluster.cli import main

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "x", "category": "qa", "messages": MESSAGES, "max_tokens": 3}) + "\n"
                 + json.dumps({"prompt": "t"}) + "\n")
    assert load_prompt_set(f) == [BenchPrompt("x", "qa", MESSAGES, 3), BenchPrompt("2", "uncategorized", "t")]
    f.write_text('{"prompt": "ok"}\n{"text": 1}\n')
    with pytest.raises(ValueError, match=f"{f}:2: each line needs"):
        load_prompt_set(f)
    assert main(["generate", "--prompts-file", str(f)]) == 2
    assert capsys.readouterr().err == f"specray: error: {f}:2: each line needs a 'prompt' or a 'messages' field\n"
