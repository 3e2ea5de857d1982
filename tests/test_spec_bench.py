"""benchmarks/spec_bench.py: Spec-Bench answer files and its speedup table, on the tiny pair."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specbench.results.record import load_records

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("spec_bench_script", ROOT / "benchmarks" / "spec_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sb = _module()

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]},
    {
        "question_id": 161,
        "category": "translation",
        "turns": ["Translate German to English: Hallo"],
        "reference": ["Hello"],
    },
    {"question_id": 321, "category": "qa", "turns": ["Who wrote Hamlet?"]},
    {"question_id": 401, "category": "math_reasoning", "turns": ["What is 2 + 3?"], "reference": ["#### 5"]},
]
ANSWER_KEYS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_KEYS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}


@pytest.fixture
def question_path(tmp_path) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def test_one_run_writes_both_answer_files_and_the_table(tmp_path, question_path, capsys):
    out = tmp_path / "answers"
    code = sb.main(
        [
            "--questions", str(question_path), "--verifier", "tiny-random", "--drafter", "tiny-random",
            "--max-new-tokens", "8", "--out-dir", str(out), "--limit", "3",
            "--results-dir", str(tmp_path / "results"),
        ]
    )  # fmt: skip
    assert code == 0
    method_file = out / "tiny-random-llama-sd-constant-gamma3-float32-temp-0.0.jsonl"
    baseline_file = out / "tiny-random-llama-vanilla-float32-temp-0.0.jsonl"
    method = [json.loads(line) for line in method_file.read_text().splitlines()]
    baseline = [json.loads(line) for line in baseline_file.read_text().splitlines()]
    assert [r["question_id"] for r in method] == [r["question_id"] for r in baseline] == [81, 161, 321]
    for row_m, row_b, question in zip(method, baseline, QUESTIONS):
        assert set(row_m) == set(row_b) == ANSWER_KEYS and row_m["category"] == question["category"]
        choice, base = row_m["choices"][0], row_b["choices"][0]
        assert set(choice) == set(base) == CHOICE_KEYS
        turns = len(question["turns"])  # every turn is answered (MT-bench's second turn too)
        assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == turns
        assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])  # emitted tokens per step
        assert len(choice["accept_lengths"]) == sum(choice["decoding_steps"])
        assert all(1 <= a <= 4 for a in choice["accept_lengths"])  # gamma 3 + bonus
        assert base["accept_lengths"] == [1] * sum(base["new_tokens"])  # autoregressive: one per step
        assert choice["turns"] == base["turns"]  # greedy exact SD reproduces the verifier
        assert all(t > 0 for t in choice["wall_time"] + base["wall_time"])
    assert method[0]["model_id"] == method_file.stem and baseline[0]["model_id"] == baseline_file.stem
    printed = capsys.readouterr().out
    assert "Task:  mt_bench" in printed and "Task:  overall" in printed and "Speedup ratio:" in printed
    header = next(line for line in printed.splitlines() if line.startswith("| Models"))
    assert "Multi-turn Conversation" in header and "#Mean Accepted Tokens" in header
    row = next(line for line in printed.splitlines() if line.startswith("| sd-constant-gamma3"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("x") and cells[3] == "-" and cells[5] == "-"  # no summarization / math here
    speed = json.loads((out / "speed.json").read_text())
    assert set(speed["tasks"]) == {"mt_bench", "translation", "qa", "overall"}
    assert speed["tasks"]["overall"]["num_questions"] == 3
    # --from-files recomputes the same table from the written files.
    assert sb.main(["--from-files", str(method_file), str(baseline_file)]) == 0
    again = capsys.readouterr().out
    assert f"Speedup ratio:  {speed['tasks']['overall']['speedup']:.4f}" in again
    # One result record (and only the one run's: --from-files records nothing), its rows what was printed.
    records = load_records(tmp_path / "results")
    assert len(records) == 1
    path, record = records[0]
    assert path.parent.name == record["benchmark"] == "spec_bench" and f"result record: {path}" in printed
    assert record["prompts"]["count"] == 3 and record["machine"]["device"] == "cpu"
    assert [r["setup"] for r in record["rows"]] == ["autoregressive", "sd-constant-gamma3"]
    base, sd = record["rows"]
    overall = speed["tasks"]["overall"]
    assert sd["figures"]["speedup"]["value"] == pytest.approx(overall["speedup"])
    assert f"{sd['figures']['speedup']['value']:.2f}x" == cells[-1]
    assert sd["figures"]["tau"]["value"] == pytest.approx(overall["mean_accepted_tokens"])
    assert f"{sd['figures']['tau']['value']:.2f}" == cells[-2]
    assert sd["figures"]["tokens_per_s"]["value"] == pytest.approx(overall["tokens_per_s"])
    assert base["figures"]["tokens_per_s"]["value"] == pytest.approx(overall["baseline_tokens_per_s"])
    low, high = sd["figures"]["speedup"]["interval"]
    assert low <= high and "median" in sd["figures"]["speedup"]
    assert sd["figures"]["speedup_translation"]["value"] == pytest.approx(
        speed["tasks"]["translation"]["speedup"]
    )
    assert sd["identical_outputs"] is True and base["identical_outputs"] is True  # greedy sd: lossless


def test_no_record_writes_no_record(tmp_path, question_path):
    code = sb.main(
        [
            "--questions", str(question_path), "--verifier", "tiny-random", "--drafter", "tiny-random",
            "--max-new-tokens", "4", "--out-dir", str(tmp_path / "answers"), "--limit", "2", "--no-record",
            "--results-dir", str(tmp_path / "results"),
        ]
    )  # fmt: skip
    assert code == 0 and not (tmp_path / "results").exists()


def test_speed_matches_spec_bench_definition():
    def row(qid, category, tokens, times, accepts):
        choice = {
            "turns": ["x"] * len(tokens),
            "new_tokens": tokens,
            "wall_time": times,
            "accept_lengths": accepts,
        }
        return {"question_id": qid, "category": category, "choices": [choice]}

    method = [row(1, "writing", [10, 10], [1.0, 1.0], [2, 3, 1]), row(2, "qa", [30], [1.0], [3, 3])]
    baseline = [row(1, "writing", [10, 10], [2.0, 2.0], [1] * 20), row(2, "qa", [30], [3.0], [1] * 30)]
    overall = sb.speed(method, baseline, "overall")
    # per-question tokens/s: method 10, 30 (mean 20); baseline 5, 10 (mean 7.5)
    assert overall["tokens_per_s"] == pytest.approx(20.0) and overall[
        "baseline_tokens_per_s"
    ] == pytest.approx(7.5)
    assert overall["speedup"] == pytest.approx(20.0 / 7.5)
    assert overall["mean_accepted_tokens"] == pytest.approx(12 / 5)
    assert sb.speed(method, baseline, "mt_bench")["speedup"] == pytest.approx(2.0)
    assert sb.speed(method, baseline, "rag") is None
    table = sb.speed_table(method, baseline)
    assert list(table) == ["mt_bench", "qa", "overall"]
    report = sb.format_report(table, "x")
    assert "| x | 2.00x | - | - | 3.00x | - | - | 2.40 | 2.67x |" in report


def test_categories_and_questions(question_path):
    assert sb.expand_categories("mt_bench,qa")[:2] == [
        "writing",
        "roleplay",
    ] and "qa" in sb.expand_categories("qa")
    with pytest.raises(ValueError, match="unknown category"):
        sb.expand_categories("poetry")
    assert [q["question_id"] for q in sb.load_questions(question_path, ["qa", "translation"])] == [161, 321]
    assert len(sb.load_questions(question_path, limit=2, seed=0)) == 2
    with pytest.raises(FileNotFoundError, match="--questions"):
        sb.load_questions(question_path.with_name("absent.jsonl"))
