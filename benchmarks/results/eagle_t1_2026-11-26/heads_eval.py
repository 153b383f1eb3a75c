"""Usage: heads_eval.py WORK HEAD[:VOCAB] ... ; VOCAB = revocab size from /tmp/t1head's training data."""
import sys, torch
from pathlib import Path
from actors.eagle.fit import evaluate, choose_draft_vocab, with_vocab, _split
from actors.eagle.data import load_examples
from actors.eagle.head import load_head, DEFAULT_HEADS
from actors.model.loader import load_model
torch.set_num_threads(2)
exs = load_examples(Path(sys.argv[1]))
target = load_model("smollm2-135m").model
train = None
for spec in sys.argv[2:]:
    path, _, size = spec.partition(":")
    path = str(DEFAULT_HEADS["smollm2-135m"]) if path == "default" else path
    head = load_head(path)
    if size:
        if train is None:
            train, _ = _split(load_examples(Path("/tmp/t1head")), 0)
        vocab, cov = choose_draft_vocab(train, int(size))
        head = with_vocab(head, vocab)
    head.attach(target)
    for T in (1.0,):
        e = evaluate(head, exs, 5, torch.device("cpu"), 4096, T)
        r = e.as_report()
        print(spec, "greedy MAL", r["mean_accepted_length"], r["accepted_per_position"][:3],
              "| T=1 depth acc", [round(x, 3) for x in e.sampled[:3]], "chain", r["sampled_accepted_per_position"][:3],
              "MAL", r["sampled_mean_accepted_length"], flush=True)
