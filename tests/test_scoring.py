"""Scorers on known cases: ROUGE, BLEU, GSM8K extraction / exact match, pass@1 programs, score_run."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest

from specbench.scoring import (
    ScoringOptions,
    check_program,
    corpus_bleu,
    cut_at_stop,
    exact_match,
    extract_number,
    fenced_code,
    gsm8k_target,
    humaneval_program,
    mbpp_program,
    rouge,
    run_python,
    sample_rewards,
    score_run,
    score_samples,
    sentence_bleu,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")
FAST = ScoringOptions(timeout_s=3.0, memory_mb=512)


# -- ROUGE / BLEU ------------------------------------------------------------------------------------


def test_rouge_known_values():
    assert rouge("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(
        {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0}
    )
    # prediction 3 tokens, reference 4: unigram P=1 R=3/4, bigram P=1 R=2/3.
    scores = rouge("the cat sat", "the cat sat on")
    assert scores["rouge1"] == pytest.approx(100 * 2 * 0.75 / 1.75)
    assert scores["rouge2"] == pytest.approx(100 * 2 * (2 / 3) / (5 / 3))
    assert scores["rougeL"] == pytest.approx(scores["rouge1"])
    assert rouge("completely different words", "the cat sat")["rouge1"] == 0.0
    assert rouge("The cats were running", "the cat runs")["rouge1"] > 0  # Porter stemming


def test_bleu_known_values():
    # One segment, 4 of 5 unigrams, 3/4 bigrams, 2/3 trigrams, 1/2 4-grams match; no brevity penalty.
    expected = 100 * math.exp((math.log(4 / 5) + math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2)) / 4)
    assert corpus_bleu(["a b c d e"], ["a b c d f"]) == pytest.approx(expected, abs=1e-6)
    assert corpus_bleu(["the cat is on the mat"], ["the cat is on the mat"]) == pytest.approx(100.0)
    assert corpus_bleu(["xyz"], ["the cat is on the mat"]) == pytest.approx(0.0)
    assert corpus_bleu([], []) == 0.0
    with pytest.raises(ValueError, match="references"):
        corpus_bleu(["a"], [])
    # Corpus BLEU pools n-gram counts; it is not the mean of sentence BLEUs.
    preds, refs = ["a b c d e", "the cat"], ["a b c d f", "the cat sat on the mat"]
    mean_sentence = sum(sentence_bleu(p, r) for p, r in zip(preds, refs)) / 2
    assert corpus_bleu(preds, refs) != pytest.approx(mean_sentence)
    assert sentence_bleu("a b c d e", "a b c d f") == pytest.approx(expected, abs=1e-6)


# -- GSM8K --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("so the total is $18.00.", "18"),
        ("The answer is 6.\n\nQ: There are 99 cars", "6"),
        ("It drops by 5, to -3 degrees", "-3"),
        ("half is 2.5", "2.5"),
        ("no digits here", None),
        ("first 12 then 15", "15"),
    ],
)
def test_extract_number(text, number):
    assert extract_number(text) == number


def test_gsm8k_target_and_exact_match():
    answer = "He pays 400*.5=$<<400*.5=200>>200 more\nSo it cost 600+400=$<<600+400=1000>>1000.\n#### 1000"
    assert gsm8k_target(answer) == "1000"
    assert exact_match(extract_number("... so 1,000 dollars in total."), gsm8k_target(answer)) == 1.0
    assert exact_match("999", "1000") == 0.0 and exact_match(None, "1") == 0.0


def test_few_shot_outputs_are_cut_at_the_next_marker():
    output = " Roger had 5 balls. 5 + 6 = 11 balls.\n\nQ: A farmer has 40 cows"
    assert cut_at_stop(output, ("Q:", "\n\n")) == "Roger had 5 balls. 5 + 6 = 11 balls."
    assert extract_number(cut_at_stop(output, ("Q:",))) == "11"
    assert extract_number(output) == "40"  # what an uncut continuation would have scored
    assert cut_at_stop("\n Paris is the capital.\nGerman: x", ("\n",)) == "Paris is the capital."


def test_score_samples_exact_match_and_missing_references():
    quality = score_samples(
        "exact_match",
        ["The answer is 4.", "I think 5", "whatever"],
        ["2 + 2 = 4\n#### 4", "#### 6", None],
    )
    assert quality.scores == [1.0, 0.0, None]
    assert quality.metrics["quality_exact_match"] == pytest.approx(0.5)
    assert quality.metrics["quality_num_scored"] == 2 and quality.metrics["quality_metric"] == "exact_match"
    assert quality.details[0] == {"prediction": "4", "target": "4"}


def test_score_samples_rouge_and_bleu():
    rouge_q = score_samples("rouge", ["the cat sat", "a dog"], ["the cat sat on", "a dog"])
    assert rouge_q.scores[1] == pytest.approx(100.0)
    assert rouge_q.metrics["quality_rouge2"] == pytest.approx((80.0 + 100.0) / 2)
    assert set(rouge_q.metrics) >= {"quality_rouge1", "quality_rouge2", "quality_rougeL"}
    bleu_q = score_samples("bleu", ["a b c d e"], ["a b c d f"], stops=("\n",))
    assert bleu_q.metrics["quality_bleu"] == pytest.approx(bleu_q.scores[0])
    cut = score_samples("bleu", ["a b c d f\nGerman: noise"], ["a b c d f"], stops=("\n",))
    assert cut.metrics["quality_bleu"] == pytest.approx(100.0)
    assert score_samples("none", ["x"], [None]).metrics == {}
    with pytest.raises(ValueError, match="dataset.metric"):
        score_samples("accuracy", ["x"], ["y"])


def test_score_samples_spec_bench_categories():
    quality = score_samples(
        "spec_bench",
        ["Pawnbrokers shine in Singapore", "The answer is 12", "a poem"],
        ["Pawnbrokers shine in Singapore", "so 12\n#### 12", None],
        categories=["translation", "math_reasoning", "writing"],
    )
    assert quality.metrics["quality_translation_bleu"] == pytest.approx(100.0)
    assert quality.metrics["quality_math_reasoning_exact_match"] == 1.0
    assert quality.scores[2] is None and quality.metrics["quality_num_scored"] == 2


# -- code ---------------------------------------------------------------------------------------------

HE_PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
HE_TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"


def test_fenced_code():
    text = "Here:\n```text\nnope\n```\nand\n```python\ndef f():\n    return 1\n```\nDone."
    assert fenced_code(text) == "def f():\n    return 1\n"
    assert fenced_code("```\nx = 1\n") == "x = 1\n"  # unterminated fence: the rest
    assert fenced_code("no code") is None


def test_humaneval_programs():
    body = humaneval_program(HE_PROMPT, "    return a + b\n\ndef unrelated():\n    pass\n", HE_TEST, "add")
    assert body.startswith(HE_PROMPT + "    return a + b") and "unrelated" not in body
    assert body.rstrip().endswith("check(add)")
    chat = humaneval_program(
        HE_PROMPT, "Sure!\n```python\ndef add(a, b):\n    return a + b\n```", HE_TEST, "add"
    )
    assert "def add(a, b):\n    return a + b" in chat and chat.startswith(HE_PROMPT)


def test_mbpp_program():
    program = mbpp_program(
        "def sq(x):\n    return x * x\n[DONE]\nmore text", ["assert sq(3) == 9"], ["import math"]
    )
    assert program == "import math\ndef sq(x):\n    return x * x\nassert sq(3) == 9\n"
    fenced = mbpp_program("```python\ndef sq(x):\n    return x*x\n```", ["assert sq(2) == 4"])
    assert "return x*x" in fenced and "```" not in fenced
    with pytest.raises(ValueError, match="code sample"):
        check_program({}, "x")


@linux_only
def test_pass_at_1_runs_programs_in_the_sandbox():
    metas = [
        {"code_prompt": HE_PROMPT, "test": HE_TEST, "entry_point": "add"},
        {"code_prompt": HE_PROMPT, "test": HE_TEST, "entry_point": "add"},
        {"code_prompt": HE_PROMPT, "test": HE_TEST, "entry_point": "add"},
        {"test_list": ["assert sq(3) == 9", "assert sq(0) == 0"], "test_imports": []},
        {"test_list": ["assert sq(3) == 9"], "test_imports": []},
    ]
    outputs = [
        "    return a + b\n",  # completion: passes
        "    return a - b\n",  # wrong
        "```python\ndef add(a, b):\n    while True:\n        pass\n```",  # hangs: timeout
        "def sq(x):\n    return x * x\n[DONE]",  # passes
        "def sq(x):\n    import os\n    os.system('true')\n    return x * x\n[DONE]",  # passes (no harm)
    ]
    quality = score_samples("pass@1", outputs, ["t"] * 5, metas=metas, options=FAST)
    assert quality.scores[:4] == [1.0, 0.0, 0.0, 1.0]
    # A subprocess is harmless inside the namespaces jail; the preamble guard refuses it.
    assert quality.scores[4] == (1.0 if quality.metrics["quality_sandbox"] == "namespaces" else 0.0)
    assert quality.details[2]["status"] == "timeout" and quality.details[1]["status"] == "failed"
    assert quality.metrics["quality_code_timeouts"] == 1
    assert quality.metrics["quality_sandbox"] in ("namespaces", "preamble")


@linux_only
def test_humaneval_canonical_solutions_pass_and_truncations_fail():
    from specbench.data.datasets import load_dataset_prompts

    prompts = load_dataset_prompts({"name": "humaneval", "limit": 4})
    rows = [json.loads(line) for line in _humaneval_lines()[:4]]
    canonical = [row["canonical_solution"] for row in rows]
    metas = [p.meta for p in prompts]
    passed = score_samples("pass@1", canonical, [p.reference for p in prompts], metas=metas, options=FAST)
    assert passed.scores == [1.0] * 4
    failed = score_samples(
        "pass@1", ["    pass\n"] * 4, [p.reference for p in prompts], metas=metas, options=FAST
    )
    assert failed.metrics["quality_pass@1"] == 0.0


def _humaneval_lines() -> list[str]:
    import gzip

    from specbench.data.dataset_sources import humaneval_file

    with gzip.open(humaneval_file(), "rt") as handle:
        return [line for line in handle if line.strip()]


@linux_only
def test_run_python_is_a_separate_process():
    import os

    result = run_python("import os\nprint(os.getpid())\n", isolation="preamble")
    assert result.passed and int(result.stdout.strip()) != os.getpid()


# -- score_run ----------------------------------------------------------------------------------------


def _prompt(pid, reference, category=None, meta=None):
    return SimpleNamespace(id=pid, reference=reference, category=category, meta=meta or {})


def test_score_run_rewrites_samples(tmp_path):
    prompts = [_prompt("a", "#### 4"), _prompt("b", "#### 6"), _prompt("c", "#### 1")]
    path = tmp_path / "samples.jsonl"
    rows = [  # a shard / resumed file: rows in any order, matched by index
        {"id": "c", "index": 2, "output_text": "The answer is 1."},
        {"id": "a", "index": 0, "output_text": "It is 4"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = score_run(path, prompts, "exact_match")
    assert metrics["quality_exact_match"] == 1.0 and metrics["quality_num_scored"] == 2
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["id"], r["reference"], r["score"]) for r in written] == [
        ("c", "#### 1", 1.0),
        ("a", "#### 4", 1.0),
    ]
    assert written[0]["score_details"] == {"prediction": "1", "target": "1"}
    assert not (tmp_path / "samples.jsonl.tmp").exists()
    assert score_run(path, prompts, "none") == {}
    path.write_text(json.dumps({"id": "zzz", "index": 0, "output_text": ""}) + "\n")
    with pytest.raises(ValueError, match="does not match"):
        score_run(path, prompts, "exact_match")


def test_sample_rewards_are_in_unit_range():
    assert sample_rewards("rouge", ["the cat sat", "a dog"], ["the cat sat on", "a dog"]) == pytest.approx(
        [0.8, 1.0]
    )
    assert sample_rewards("bleu", ["a b c d f"], ["a b c d f"]) == pytest.approx([1.0])
    assert sample_rewards("exact_match", ["so 4", "5"], ["#### 4", None]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="reward"):
        sample_rewards("none", ["x"], ["y"])
