"""Prompt loaders (demo, jsonl with prompt / turns, Spec-Bench, limit / seed, corrupt lines) and templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbench.data import (
    Prompt,
    demo_path,
    encode_prompt,
    load_demo,
    load_jsonl,
    load_prompts,
    subset,
)
from specbench.models import byte_tokenizer

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_demo_prompts_ship_inside_the_package():
    path = demo_path()
    assert path.is_file()
    assert path.parent == Path(__import__("specbench.data").data.__file__).parent
    prompts = load_demo()
    assert 6 <= len(prompts) <= 12
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(isinstance(p, Prompt) and p.text.strip() and p.category for p in prompts)
    assert len({p.category for p in prompts}) >= 5
    assert load_prompts("demo") == prompts


def test_prompt_rows(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "prompt": "Say hi.", "category": "chat", "reference": "hi", "extra": 1},
            {"prompt": "No id here."},
        ],
    )
    first, second = load_jsonl(path)
    assert (first.id, first.text, first.category, first.reference, first.meta) == (
        "a",
        "Say hi.",
        "chat",
        "hi",
        {"extra": 1},
    )
    assert (second.id, second.text, second.reference, second.category) == (2, "No id here.", None, None)


def test_turns_rows_use_the_first_turn(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"question_id": 7, "category": "math", "turns": ["One?", "Two?"]}]
    )
    [prompt] = load_jsonl(path)
    assert (prompt.id, prompt.text, prompt.category) == (7, "One?", "math")
    assert prompt.meta["turns"] == ["One?", "Two?"]


def test_custom_prompt_field(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"instruction": "Do it.", "prompt": "not this"}])
    assert load_prompts("jsonl", path, prompt_field="instruction")[0].text == "Do it."


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"prompt": "x"}\n\n{"prompt": "y"}\n')
    assert [p.id for p in load_jsonl(path)] == [1, 3]


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"prompt": "broken"', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"text": "no prompt field"}', "none of the prompt fields"),
        ('{"turns": []}', "non-empty list"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"prompt": "ok too"}, bad_line])
    with pytest.raises(ValueError, match=message) as info:
        load_jsonl(path)
    assert f"{path}:3" in str(info.value)


def test_missing_file_and_unknown_dataset(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_jsonl(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="dataset.path"):
        load_prompts("jsonl")
    with pytest.raises(ValueError, match="dataset.name"):
        load_prompts("mnist")


def test_limit_and_seeded_subset():
    items = list(range(20))
    assert subset(items, 5) == [0, 1, 2, 3, 4]
    assert subset(items, None) == items and subset(items, 50) == items
    picked = subset(items, 5, seed=3)
    assert picked == subset(items, 5, seed=3)
    assert picked == sorted(picked) and len(set(picked)) == 5 and picked != [0, 1, 2, 3, 4]
    assert subset(items, 5, seed=4) != picked
    with pytest.raises(ValueError, match="dataset.limit"):
        subset(items, 0)


def test_demo_limit_and_seed():
    everything = load_demo()
    assert load_demo(limit=3) == everything[:3]
    seeded = load_demo(limit=3, seed=1)
    assert seeded == load_demo(limit=3, seed=1)
    assert all(p in everything for p in seeded)


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="Spec-Bench question.jsonl not present")
def test_spec_bench_questions_load():
    prompts = load_prompts("jsonl", SPEC_BENCH)
    assert len(prompts) == 480
    rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    assert [p.id for p in prompts] == [r["question_id"] for r in rows]
    assert [p.text for p in prompts] == [r["turns"][0] for r in rows]
    assert len({p.category for p in prompts}) == 13
    assert any(p.reference is not None for p in prompts)
    subset_a = load_prompts("jsonl", SPEC_BENCH, limit=10, seed=0)
    assert [p.id for p in subset_a] == [p.id for p in load_prompts("jsonl", SPEC_BENCH, limit=10, seed=0)]
    assert len({p.category for p in subset_a}) > 1  # a seeded subset spreads over the file


def test_encode_prompt_uses_the_chat_template():
    tokenizer = byte_tokenizer()
    ids, used = encode_prompt(tokenizer, "hi")
    assert used == "chat"
    assert tokenizer.decode(ids) == "User: hi\nAssistant: "
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert ids == list(expected["input_ids"])


def test_encode_prompt_plain_without_template():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    ids, used = encode_prompt(tokenizer, "hi")
    assert (used, ids) == ("plain", tokenizer("hi")["input_ids"])
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(tokenizer, "hi", mode="chat")


def test_encode_prompt_forced_plain():
    tokenizer = byte_tokenizer()
    ids, used = encode_prompt(tokenizer, "hi", mode="plain")
    assert (used, tokenizer.decode(ids)) == ("plain", "hi")


def test_sharegpt_and_chat_message_rows_give_their_first_user_turn(tmp_path):
    """ShareGPT-style prompt sets (the SD² recipe's second stage) load as jsonl with their first user turn."""
    import json

    from specbench.data.prompts import load_jsonl

    path = tmp_path / "sharegpt.jsonl"
    rows = [
        {
            "id": "a",
            "conversations": [
                {"from": "system", "value": "be nice"},
                {"from": "human", "value": "Hi?"},
                {"from": "gpt", "value": "Hello."},
            ],
        },
        {
            "id": "b",
            "messages": [
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Red"},
            ],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [(p.id, p.text) for p in load_jsonl(path)] == [("a", "Hi?"), ("b", "Name a colour.")]
    path.write_text(json.dumps({"conversations": [{"from": "gpt", "value": "no question"}]}) + "\n")
    with pytest.raises(ValueError, match="has no user turn"):
        load_jsonl(path)
