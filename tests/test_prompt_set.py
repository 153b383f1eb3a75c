"""The 500-prompt benchmark set (benchmarks/prompts/bench500.jsonl): the category mix and output
budgets of the methodology, real 500-1000 word summarization inputs, Korean in both translation
directions, no near-duplicates, and a file that its generator reproduces byte for byte."""
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pytest

from benchmarks.prompts.korean import josa

ROOT = Path(__file__).resolve().parent.parent
SET = ROOT / "benchmarks" / "prompts" / "bench500.jsonl"
# category -> (count, lowest max_tokens, highest max_tokens), as the methodology prescribes
SPEC = {"short_qa": (150, 50, 100), "summarization": (100, 150, 300), "code_generation": (80, 100, 500),
        "creative_writing": (50, 300, 800), "translation": (70, 100, 300), "structured_output": (50, 50, 200)}
HANGUL = re.compile(r"[\uac00-\ud7a3]")
FENCE = '"""'
DOCUMENT = re.compile(r'(?:^|\n)"""\n(.+)\n"""(?:\n|$)', re.S)


@pytest.fixture(scope="module")
def items() -> list[dict]:
    return [json.loads(line) for line in SET.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def by_category(items) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for item in items:
        groups[item["category"]].append(item)
    return groups


def text_of(item: dict) -> str:
    return "\n".join(m["content"] for m in item["messages"])


def user_text(item: dict) -> str:
    return item["messages"][-1]["content"]


def test_counts_and_proportions(items, by_category):
    assert len(items) == 500
    assert {c: len(v) for c, v in by_category.items()} == {c: spec[0] for c, spec in SPEC.items()}
    for category, (count, *_) in SPEC.items():
        assert len(by_category[category]) / len(items) == pytest.approx(count / 500)


def test_ids_unique_and_numbered_per_category(items, by_category):
    ids = [item["id"] for item in items]
    assert len(set(ids)) == len(ids)
    for category, group in by_category.items():
        assert [g["id"] for g in group] == [f"{category}-{i:03d}" for i in range(1, len(group) + 1)]


def test_record_shape(items):
    for item in items:
        assert set(item) == {"id", "category", "messages", "max_tokens"}, item["id"]
        roles = [m["role"] for m in item["messages"]]
        assert roles in (["user"], ["system", "user"]), item["id"]
        for m in item["messages"]:
            assert set(m) == {"role", "content"} and isinstance(m["content"], str) and m["content"].strip()
            assert "{" not in m["content"] or item["category"] in ("code_generation", "structured_output"), \
                f"{item['id']}: unfilled template slot?"


def test_max_tokens_within_category_range(by_category):
    for category, (_, lo, hi) in SPEC.items():
        budgets = [item["max_tokens"] for item in by_category[category]]
        assert all(isinstance(b, int) and lo <= b <= hi for b in budgets), (category, min(budgets), max(budgets))
        assert len(set(budgets)) >= 4, f"{category}: output budgets should vary with the task"


def test_summarization_inputs_are_500_to_1000_words_and_distinct(by_category):
    documents = []
    for item in by_category["summarization"]:
        assert user_text(item).count(FENCE) == 2, item["id"]
        fenced = DOCUMENT.search(user_text(item))  # the document sits between two lines of three quotes
        assert fenced, item["id"]
        document = fenced.group(1)
        assert 500 <= len(document.split()) <= 1000, (item["id"], len(document.split()))
        documents.append(document)
    assert len(set(documents)) == len(documents)
    titles = Counter(d.strip().splitlines()[0] for d in documents)
    assert titles.most_common(1)[0][1] == 1, titles.most_common(3)


def _split_translation(item: dict) -> tuple[str, str]:
    instruction, source = user_text(item).split("\n\n", 1)
    return instruction, source


def _hangul_share(text: str) -> float:
    letters = [ch for ch in text if ch.isalpha()]
    return sum(bool(HANGUL.match(ch)) for ch in letters) / max(1, len(letters))


def test_translation_has_korean_both_ways_and_other_pairs(by_category):
    ko_to_en = en_to_ko = other = 0
    for item in by_category["translation"]:
        instruction, source = _split_translation(item)
        korean_source = _hangul_share(source) > 0.6
        if korean_source and ("English" in instruction or "영어" in instruction):
            ko_to_en += 1
        elif _hangul_share(source) == 0 and ("Korean" in instruction or "한국어" in instruction):
            en_to_ko += 1
        else:
            other += 1
    assert ko_to_en >= 20 and en_to_ko >= 20, (ko_to_en, en_to_ko)
    assert other >= 10, other


def test_korean_appears_across_categories(by_category):
    for category in ("short_qa", "summarization", "code_generation", "creative_writing", "structured_output"):
        share = sum(bool(HANGUL.search(text_of(i))) for i in by_category[category]) / len(by_category[category])
        assert 0.05 <= share <= 0.5, (category, share)


def shingles(text: str, n: int = 5) -> frozenset:
    words = re.findall(r"\w+", text.lower())
    if len(words) < n:
        return frozenset([tuple(words)])
    return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def max_jaccard(texts: list[str], floor: float) -> tuple[float, int, int]:
    """Highest word 5-gram Jaccard similarity over all pairs. Pairs whose set sizes alone cap the
    similarity below `floor` (|A∩B|/|A∪B| <= min/max) are skipped without intersecting."""
    sets = [shingles(t) for t in texts]
    order = sorted(range(len(sets)), key=lambda i: len(sets[i]))
    best = (0.0, -1, -1)
    for a, b in combinations(order, 2):  # len(sets[a]) <= len(sets[b])
        small, large = sets[a], sets[b]
        if len(small) / len(large) < max(floor, best[0]):
            continue
        inter = len(small & large)
        score = inter / (len(small) + len(large) - inter)
        if score > best[0]:
            best = (score, a, b)
    return best


def test_max_jaccard_finds_near_duplicates():
    base = "Write a short story about a lighthouse keeper who finds a letter from the future on the beach."
    assert max_jaccard([base, base.replace("beach", "shore"), "Why is the sky blue?"], 0.5)[0] > 0.5
    assert max_jaccard(["Why is the sky blue?", "How do vaccines work in the body?"], 0.5)[0] == 0.0


def test_no_near_duplicates_within_a_category(by_category):
    for category, group in by_category.items():
        score, a, b = max_jaccard([text_of(i) for i in group], 0.5)
        assert score < 0.5, (category, round(score, 3), group[a]["id"], group[b]["id"])


def test_generator_reproduces_the_committed_file(tmp_path):
    out = tmp_path / "bench500.jsonl"
    env = dict(os.environ, PYTHONHASHSEED="12345")  # a hash-order dependence would show up as a diff
    subprocess.run([sys.executable, "-m", "benchmarks.prompts.build_prompts", "--out", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    assert out.read_bytes() == SET.read_bytes()


def test_file_size_is_reasonable():
    assert SET.stat().st_size < 3 * 1024 * 1024


def test_korean_particles_agree_with_the_word_before_them():
    assert [josa(w, "으로/로") for w in ("서울", "부산", "제주", "지하철")] == ["서울로", "부산으로", "제주로", "지하철로"]
    assert [josa(w, "이/가") for w in ("하루마켓", "새싹소프트")] == ["하루마켓이", "새싹소프트가"]
    assert [josa(w, "은/는") for w in ("멍멍하우스", "해피테일 호텔", "3", "2")] == ["멍멍하우스는", "해피테일 호텔은", "3은", "2는"]
    with pytest.raises(ValueError, match="'Seoul'"):
        josa("Seoul", "은/는")
    with pytest.raises(ValueError, match="'와/과'"):
        josa("서울", "와/과")


HELDOUT = Path(__file__).parent.parent / "benchmarks" / "prompts" / "heldout_magpie.jsonl"


def _shingles(text: str, n: int = 6) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_heldout_set_is_kept_apart_from_training_and_bench500():
    """The held-out set (issue 29) shares no six-word run with the draft's training prompts (the
    committed head's recipe: training.prompt_mix, 3,000 prompts) nor with bench500, covers the six
    categories, and no training module reads it or its topic source (Debian package descriptions;
    training.magpie's requests take their topics from the target's vocabulary)."""
    from training.prompt_mix import build_prompt_mix

    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines()]
    assert {r["category"] for r in rows} == {"short_qa", "translation", "summarization", "code_generation",
                                             "structured_output", "creative_writing"}
    held = set().union(*(_shingles(r["messages"][-1]["content"]) for r in rows))
    train = set().union(*(_shingles(m[-1]["content"]) for m in build_prompt_mix(3000)))
    bench = set().union(*(_shingles(json.dumps(json.loads(line)["messages"], ensure_ascii=False))
                          for line in (HELDOUT.parent / "bench500.jsonl").read_text(encoding="utf-8").splitlines()))
    assert not held & train, sorted(held & train)[:3]
    assert not held & bench, sorted(held & bench)[:3]
    training = Path(__file__).parent.parent / "training"
    assert not [p.name for p in training.glob("*.py") if "heldout" in p.read_text() or "dpkg" in p.read_text()]
