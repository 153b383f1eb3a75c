"""`specray generate`: JSON output fields, prompts files, and bad input -> one line, exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cli import main

REPO = Path(__file__).parent.parent


def run_cli(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("argv, needle", [
    (["--spec-tokens", "-1", "--draft", "ngram"], "num_spec_tokens=-1"),
    (["--tree", "1,0,2", "--draft", "ngram"], "'1,0,2'"),
    (["--tree", "a,b", "--draft", "ngram"], "'a,b'"),
    (["--temperature", "-0.5"], "temperature=-0.5"),
    (["--top-p", "0"], "top_p=0.0"),
    (["--top-p", "1.5"], "top_p=1.5"),
    (["--max-tokens", "0"], "max_tokens=0"),
    (["--draft", "layerskip:x"], "layerskip:x"),
    (["--concurrency", "0"], "--concurrency 0"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
])
def test_bad_input_one_line_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, "generate", "hello", *argv)
    assert code == 2
    assert err.startswith("specray: error: ") and err.count("\n") == 1, err
    assert needle in err
    assert "Traceback" not in err and out == ""


def test_bad_prompts_file_names_the_line(capsys, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{not json}\n')
    code, _, err = run_cli(capsys, "generate", "--prompts-file", str(f))
    assert code == 2 and f"{f}:2" in err
    f.write_text('{"text": "no prompt field"}\n')
    code, _, err = run_cli(capsys, "generate", "--prompts-file", str(f))
    assert code == 2 and "'prompt' or a 'messages'" in err


def test_a_prompts_file_line_carries_its_prediction():
    from argparse import Namespace

    from cluster.cli import SAMPLING_FLAGS, engine_requests
    from cluster.prompt_file import PromptLine
    from cluster.request import RequestError

    args = Namespace(max_tokens=16, **dict.fromkeys(SAMPLING_FLAGS))
    lines = [PromptLine(1, {"prompt": "a", "prediction": "b c"}), PromptLine(2, {"prompt": "x", "max_tokens": 4})]
    assert [(r.params.prediction, r.params.max_tokens) for r in engine_requests(args, lines)] == [("b c", 16),
                                                                                                 (None, 4)]
    with pytest.raises(RequestError, match="prediction"):
        engine_requests(args, [PromptLine(3, {"prompt": "a", "prediction": 5})])


def test_structured_output_from_the_flag_or_a_line():
    from argparse import Namespace

    from actors.structured_output import StructuredOutput
    from cluster.cli import SAMPLING_FLAGS, engine_requests
    from cluster.prompt_file import PromptLine
    from cluster.request import RequestError

    args = Namespace(max_tokens=16, response_format='{"type": "json_object"}', **dict.fromkeys(SAMPLING_FLAGS))
    lines = [PromptLine(1, {"prompt": "a"}),
             PromptLine(2, {"prompt": "b", "response_format": {"type": "choice", "choice": ["x", "y"]}}),
             PromptLine(3, {"prompt": "c", "response_format": {"type": "text"}})]
    assert [r.params.structured for r in engine_requests(args, lines)] == [
        StructuredOutput(kind="json_object"), StructuredOutput(kind="choice", value=("x", "y")), None]
    with pytest.raises(RequestError, match="--response-format '{json'"):
        engine_requests(Namespace(max_tokens=16, response_format="{json", **dict.fromkeys(SAMPLING_FLAGS)), lines)
    with pytest.raises(RequestError, match="type 'grammar' needs its 'grammar' field"):
        engine_requests(args, [PromptLine(4, {"prompt": "a", "response_format": {"type": "grammar"}})])


@pytest.mark.model
def test_generate_with_a_response_format(capsys):
    code, out, err = run_cli(capsys, "generate", "--chat", "--max-tokens", "8", "--json", "--draft", "none",
                             "--response-format", '{"type": "choice", "choice": ["blue", "green"]}',
                             "What colour is the sea?")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["text"] in ("blue", "green")


def test_console_script_exit_code_and_no_traceback():
    exe = REPO / ".venv" / "bin" / "specray"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cluster.cli"]
    proc = subprocess.run(cmd + ["generate", "x", "--temperature", "-1"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert "temperature=-1.0" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.model
def test_generate_json_fields_and_prompts_file(capsys, tmp_path, default_model):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 6}) + "\n"
                 + json.dumps({"prompt": "The capital of France is"}) + "\n")
    code, out, err = run_cli(capsys, "generate", "--prompts-file", str(f), "--chat", "--json", "--max-tokens", "9",
                             "--draft", "ngram", "--concurrency", "1")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2
    for key in ("text", "token_ids", "finish_reason", "num_prompt_tokens", "num_output_tokens", "num_drafts",
                "num_draft_tokens", "num_accepted_tokens", "ttft_s", "e2e_s"):
        assert key in rows[0] and key in rows[1]
    assert rows[0]["num_output_tokens"] <= 6 and rows[1]["num_output_tokens"] <= 9
    assert rows[1]["num_output_tokens"] == len(rows[1]["token_ids"]) > 0
    assert rows[0]["e2e_s"] >= rows[0]["ttft_s"] > 0


@pytest.mark.model
def test_prompt_longer_than_context(capsys, default_model):
    code, _, err = run_cli(capsys, "generate", "word " * 9000)
    assert code == 2 and "context is" in err and "tokens" in err


@pytest.mark.model
def test_draft_with_other_tokenizer_is_rejected(capsys, tmp_path, tiny_model_dir, default_model):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    draft = tiny_model_dir("llama", seed=5)
    vocab = {f"w{i}": i for i in range(256)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0").save_pretrained(draft)
    code, _, err = run_cli(capsys, "generate", "hello", "--draft", str(draft))
    assert code == 2 and "256" in err and "49152" in err


def test_benchmarks_registers_its_own_subcommands(monkeypatch):
    """Serving code imports no benchmark module to start; bench/tune come from benchmarks.cli:register,
    and the CLI works without them when the package is not there."""
    import cluster.cli as cli

    code = ("import sys, cluster.cli, cluster.serve_cli, deployments.app, deployments.batch; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
    sub = cli.build_parser()._subparsers._group_actions[0]
    assert list(sub.choices) == ["generate", "bench", "tune", "serve"]
    from benchmarks.runner import cmd_bench
    from benchmarks.tune import cmd_tune

    assert sub.choices["bench"].get_default("func") is cmd_bench
    assert sub.choices["tune"].get_default("func") is cmd_tune
    monkeypatch.setattr(cli, "PLUGIN_COMMANDS", ("no_such_package.cli",))
    assert list(cli.build_parser()._subparsers._group_actions[0].choices) == ["generate", "serve"]
