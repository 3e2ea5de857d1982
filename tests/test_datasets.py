"""Every dataset option: its template and reference on a fixture in the hub schema, its config, its
sources (local file, package, question file, hub cache offline), and an eval run with quality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, compose_config, launch
from omegaconf import OmegaConf

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError, DatasetNotFoundError, validate
from specbench.data.dataset_config import dataset_settings
from specbench.data.dataset_sources import DatasetUnavailableError, question_file
from specbench.data.dataset_specs import MT_BENCH_CATEGORIES, SPECS
from specbench.data.datasets import DatasetPrompt, encode_messages, encode_sample, load_dataset_prompts
from specbench.data.fewshot import GSM8K_COT, MBPP_EXEMPLARS
from specbench.models import byte_tokenizer

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random"]
HUB_DATASETS = ("cnndm", "xsum", "wmt", "gsm8k", "mbpp", "alpaca", "ultrachat")

# Two rows per dataset in its hub schema (field names as on the hub).
FIXTURES = {
    "cnndm": [
        {
            "id": "c1",
            "article": "The mayor opened a bridge on Monday. Crowds cheered.",
            "highlights": "Mayor opens bridge.",
        },
        {"id": "c2", "article": "Rain fell all week in the north.", "highlights": "A wet week."},
    ],
    "xsum": [
        {"id": "x1", "document": "A long story about a cat that learned to swim.", "summary": "Cat swims."},
        {"id": "x2", "document": "The team won the final after extra time.", "summary": "Team wins final."},
    ],
    "wmt": [
        {"translation": {"de": "Guten Morgen.", "en": "Good morning."}},
        {"translation": {"de": "Das Haus ist klein.", "en": "The house is small."}},
    ],
    "gsm8k": [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A box holds 6 eggs. How many in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"},
    ],
    "mbpp": [
        {
            "source_file": "x.py",
            "task_id": 11,
            "prompt": "Write a function to square a number.",
            "code": "def square(x):\n    return x * x",
            "test_imports": [],
            "test_list": ["assert square(3) == 9", "assert square(0) == 0"],
        },
        {
            "source_file": "x.py",
            "task_id": 12,
            "prompt": "Write a function to add one.",
            "code": "def inc(x):\n    return x + 1",
            "test_imports": ["import math"],
            "test_list": ["assert inc(1) == 2"],
        },
    ],
    "alpaca": [
        {"instruction": "Name a primary color.", "output": "Red.", "generator": "x", "dataset": "y"},
        {"instruction": "Say hello in French.", "output": "Bonjour.", "generator": "x", "dataset": "y"},
    ],
    "ultrachat": [
        {
            "prompt": "How do plants grow?",
            "prompt_id": "u1",
            "messages": [
                {"role": "user", "content": "How do plants grow?"},
                {"role": "assistant", "content": "..."},
            ],
        },
        {
            "prompt": "Tell me a joke.",
            "prompt_id": "u2",
            "messages": [
                {"role": "user", "content": "Tell me a joke."},
                {"role": "assistant", "content": "..."},
            ],
        },
    ],
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def fixture_file(tmp_path):
    def make(name: str) -> Path:
        return write_jsonl(tmp_path / f"{name}.jsonl", FIXTURES[name])

    return make


def load(name: str, **values):
    return load_dataset_prompts({"name": name, **values})


# -- templates and references -----------------------------------------------------------------------


def test_cnndm_and_xsum(fixture_file):
    first, second = load("cnndm", path=str(fixture_file("cnndm")))
    assert (first.id, first.reference) == ("c1", "Mayor opens bridge.")
    assert first.text.startswith("Summarize the following news article") and first.text.endswith(
        "Crowds cheered."
    )
    assert first.completion == "Article: The mayor opened a bridge on Monday. Crowds cheered.\n\nSummary:"
    assert second.reference == "A wet week."
    x = load("xsum", path=str(fixture_file("xsum")))[0]
    assert (x.id, x.reference) == ("x1", "Cat swims.")
    assert "in one sentence" in x.text and x.completion.endswith("One-sentence summary:")


def test_wmt_direction_follows_the_config(fixture_file):
    first = load("wmt", path=str(fixture_file("wmt")))[0]
    assert first.reference == "Good morning."
    assert "German text to English" in first.text and first.text.endswith("Guten Morgen.")
    assert first.completion == "German: Guten Morgen.\nEnglish:"
    reverse = load("wmt", path=str(fixture_file("wmt")), hf_config="en-de")[0]
    assert reverse.reference == "Guten Morgen." and reverse.completion == "English: Good morning.\nGerman:"
    assert [p.id for p in load("wmt", path=str(fixture_file("wmt")))] == [1, 2]  # row numbers


def test_gsm8k_chat_plain_and_few_shot(fixture_file):
    path = str(fixture_file("gsm8k"))
    auto = load("gsm8k", path=path)[0]
    assert auto.reference.endswith("#### 7") and "####" in auto.text
    assert auto.completion_format == "fewshot"
    assert auto.completion.count("Q: ") == 9 and auto.completion.endswith(
        "Q: Tom has 3 apples and buys 4 more. How many?\nA:"
    )
    assert auto.completion.startswith(f"Q: {GSM8K_COT[0][0]}\nA: {GSM8K_COT[0][1]}\n\n")
    two = load("gsm8k", path=path, prompt_format="fewshot", num_fewshot=2)[0]
    assert two.completion.count("Q: ") == 3
    plain = load("gsm8k", path=path, prompt_format="plain")[0]
    assert plain.completion_format == "plain" and plain.completion.startswith("Question: Tom")


def test_humaneval_from_the_package():
    prompts = load("humaneval")
    assert len(prompts) == 164 and prompts[0].id == "HumanEval/0"
    first = prompts[0]
    assert first.completion == first.meta["code_prompt"] and first.completion.startswith(
        "from typing import List"
    )
    assert first.reference.rstrip().endswith("check(has_close_elements)")
    assert first.meta["entry_point"] == "has_close_elements" and "```python" in first.text
    assert [p.id for p in load("humaneval", limit=3, seed=1)] == [
        p.id for p in load("humaneval", limit=3, seed=1)
    ]


def test_mbpp_few_shot_and_tests(fixture_file):
    first, second = load("mbpp", path=str(fixture_file("mbpp")))
    assert first.id == 11 and first.reference == "assert square(3) == 9\nassert square(0) == 0"
    assert first.meta["test_list"] == ["assert square(3) == 9", "assert square(0) == 0"]
    assert second.meta["test_imports"] == ["import math"]
    assert (
        "assert square(3) == 9" in first.text and "assert square(0) == 0" not in first.text
    )  # one test shown
    assert first.completion_format == "fewshot" and first.completion.count("[BEGIN]") == 4
    assert first.completion.count("[DONE]") == len(MBPP_EXEMPLARS) and first.completion.endswith("[BEGIN]\n")
    full_schema = [
        {
            "task_id": 5,
            "text": "Write f.",
            "code": "",
            "test_list": ["assert f() == 1"],
            "test_setup_code": "",
        }
    ]
    path = write_jsonl(Path(fixture_file("mbpp")).with_name("full.jsonl"), full_schema)
    assert load("mbpp", path=str(path))[0].text.startswith("Write f.")


def test_alpaca_and_ultrachat(fixture_file):
    a = load("alpaca", path=str(fixture_file("alpaca")))[0]
    assert (a.text, a.reference) == ("Name a primary color.", None)
    assert a.completion == "### Instruction:\nName a primary color.\n\n### Response:\n"
    u = load("ultrachat", path=str(fixture_file("ultrachat")))[1]
    assert (u.id, u.text, u.reference) == ("u2", "Tell me a joke.", None)
    no_prompt = write_jsonl(
        Path(fixture_file("ultrachat")).with_name("m.jsonl"),
        [{"messages": [{"role": "user", "content": "Hi?"}]}],
    )
    assert load("ultrachat", path=str(no_prompt))[0].text == "Hi?"


@pytest.mark.skipif(not question_file().is_file(), reason="Spec-Bench question.jsonl not present")
def test_spec_bench_and_mt_bench_from_the_question_file():
    everything = load("spec_bench")
    assert len(everything) == 480 and len({p.category for p in everything}) == 13
    translation = [p for p in everything if p.category == "translation"]
    assert all(isinstance(p.reference, str) and p.reference for p in translation)
    assert everything[0].meta["turns"][1] and everything[0].text == everything[0].meta["turns"][0]
    mt = load("mt_bench")
    assert len(mt) == 80 and {p.category for p in mt} == set(MT_BENCH_CATEGORIES)
    assert all(p.reference is None for p in mt)
    some = load("spec_bench", categories=["qa", "rag"], limit=5, seed=0)
    assert len(some) == 5 and {p.category for p in some} <= {"qa", "rag"}
    assert [p.id for p in some] == [
        p.id for p in load("spec_bench", categories=["qa", "rag"], limit=5, seed=0)
    ]


def test_question_file_path_and_environment(tmp_path, monkeypatch):
    rows = [
        {"question_id": 1, "category": "qa", "turns": ["Who?"]},
        {"question_id": 2, "category": "writing", "turns": ["Write."]},
    ]
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    assert [p.id for p in load("spec_bench", path=str(path))] == [1, 2]
    assert [p.id for p in load("mt_bench", path=str(path))] == [2]
    monkeypatch.setenv("SPECBENCH_SPEC_BENCH_QUESTIONS", str(tmp_path / "absent.jsonl"))
    with pytest.raises(DatasetUnavailableError, match="dataset.path=question.jsonl"):
        load("spec_bench")


def test_generic_jsonl_parquet_and_disk(tmp_path):
    rows = [
        {"id": "r1", "prompt": "Translate: Hallo", "target": "Hello"},
        {"id": "r2", "turns": ["Hi?", "More"], "target": "x"},
    ]
    jsonl = write_jsonl(tmp_path / "g.jsonl", rows)
    first = load("jsonl", path=str(jsonl), reference_field="target")[0]
    assert (first.id, first.text, first.reference) == ("r1", "Translate: Hallo", "Hello")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{"prompt": "P1", "reference": "R1"}, {"prompt": "P2", "reference": "R2"}]),
        tmp_path / "g.parquet",
    )
    parquet = load("parquet", path=str(tmp_path / "g.parquet"), limit=1)
    assert [(p.id, p.text, p.reference) for p in parquet] == [(1, "P1", "R1")]
    import datasets

    datasets.Dataset.from_list(FIXTURES["xsum"]).save_to_disk(str(tmp_path / "xsum_disk"))
    assert [p.reference for p in load("xsum", path=str(tmp_path / "xsum_disk"))] == [
        "Cat swims.",
        "Team wins final.",
    ]
    cnndm_parquet = tmp_path / "cnndm.parquet"
    pq.write_table(pa.Table.from_pylist(FIXTURES["cnndm"]), cnndm_parquet)
    assert load("cnndm", path=str(cnndm_parquet))[1].reference == "A wet week."


def test_rows_outside_the_schema_name_file_and_row(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"article": "fine", "highlights": "ok"}, {"text": "wrong schema"}]
    )
    with pytest.raises(ValueError, match=r"bad.jsonl:2: row has no field 'article'"):
        load("cnndm", path=str(path))
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    with pytest.raises(ValueError, match=r"corrupt.jsonl:2: not valid JSON"):
        load("gsm8k", path=str(corrupt))


# -- prompt formats -----------------------------------------------------------------------------------


def test_encode_sample_formats(fixture_file):
    tokenizer = byte_tokenizer()
    prompt = load("gsm8k", path=str(fixture_file("gsm8k")))[0]
    ids, used = encode_sample(tokenizer, prompt, "auto")
    assert used == "chat" and tokenizer.decode(ids).startswith("User: Tom has 3 apples")
    tokenizer.chat_template = None  # a base model
    ids, used = encode_sample(tokenizer, prompt, "auto")
    assert used == "fewshot" and tokenizer.decode(ids, skip_special_tokens=True) == prompt.completion
    plain = load("gsm8k", path=str(fixture_file("gsm8k")), prompt_format="plain")[0]
    assert encode_sample(tokenizer, plain, "plain")[1] == "plain"
    with pytest.raises(ValueError, match="no chat template"):
        encode_sample(tokenizer, prompt, "chat")
    with pytest.raises(ValueError, match="dataset.prompt_format"):
        encode_sample(tokenizer, prompt, "jinja")
    bare = DatasetPrompt(id=1, text="hi")
    assert encode_sample(tokenizer, bare, "auto")[1] == "plain"


def test_encode_messages_multi_turn():
    tokenizer = byte_tokenizer()
    ids, used = encode_messages(
        tokenizer,
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
    )
    assert used == "chat" and tokenizer.decode(ids) == "User: a\nAssistant: b</s>\nUser: c\nAssistant: "


def test_scorer_cuts_only_completion_formats():
    settings = dataset_settings({"name": "gsm8k"})
    assert settings.scorer("chat") == ("exact_match", ())
    assert settings.scorer("fewshot") == ("exact_match", SPECS["gsm8k"].stops)
    assert dataset_settings({"name": "demo"}).scorer("chat") == ("none", ())


# -- configs ------------------------------------------------------------------------------------------


def test_every_dataset_option_has_a_yaml_matching_the_registry():
    options = sorted(p.stem for p in (ROOT / "conf" / "dataset").glob("*.yaml"))
    assert options == sorted(SPECS)
    for name, spec in SPECS.items():
        node = compose_config([f"dataset={name}"]).dataset
        assert node.name == name
        for key in ("hf_id", "hf_config", "split", "reference_field", "metric"):
            value = node.get(key)
            assert value in (None, getattr(spec, key)), (name, key, value)
        settings = dataset_settings(node) if name not in ("jsonl", "parquet") else None
        if settings is not None:
            assert (settings.hf_id, settings.split, settings.metric) == (spec.hf_id, spec.split, spec.metric)


@pytest.mark.parametrize("name", HUB_DATASETS)
def test_hub_datasets_validate_with_a_local_copy(name, fixture_file):
    cfg = compose_config([*TINY, f"dataset={name}", f"dataset.path={fixture_file(name)}"])
    validate(cfg)  # no hub access needed
    assert len(load_dataset_prompts(cfg.dataset)) == 2


@pytest.mark.parametrize("name", HUB_DATASETS)
def test_missing_offline_dataset_says_how_to_use_a_local_copy(name, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = compose_config([*TINY, f"dataset={name}"])
    with pytest.raises(DatasetNotFoundError) as info:
        validate(cfg)
    message = str(info.value)
    assert "dataset.path=" in message and SPECS[name].hf_id in message and "\n" not in message
    with pytest.raises(DatasetUnavailableError, match="dataset.path="):
        load_dataset_prompts(cfg.dataset)  # the loader gives the same advice


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["dataset=gsm8k", "dataset.prompt_format=jinja"], "dataset.prompt_format"),
        (["dataset=cnndm", "dataset.prompt_format=fewshot"], "dataset.prompt_format=fewshot"),
        (["dataset=gsm8k", "dataset.num_fewshot=9"], "dataset.num_fewshot"),
        (["dataset=gsm8k", "dataset.metric=accuracy"], "dataset.metric"),
        (["dataset=spec_bench", "dataset.categories=[poetry]"], "dataset.categories"),
        (["dataset=humaneval", "dataset.categories=[qa]"], "dataset.categories"),
        (["dataset=wmt", "dataset.hf_config=deen"], "dataset.hf_config"),
        (["dataset=parquet"], "dataset.path"),
        (["dataset.name=mnist"], "dataset.name"),
        (["scoring.isolation=chroot"], "scoring.isolation"),
        (["scoring.timeout_s=0"], "scoring.timeout_s"),
        (["scoring.workers=0"], "scoring.workers"),
    ],
)
def test_bad_dataset_and_scoring_values(overrides, key, fixture_file):
    if overrides[0] in ("dataset=gsm8k", "dataset=cnndm", "dataset=wmt"):
        overrides = [*overrides, f"dataset.path={fixture_file(overrides[0].split('=')[1])}"]
    with pytest.raises(ConfigError) as info:
        validate(compose_config([*TINY, *overrides]))
    assert key in str(info.value) and "\n" not in str(info.value)


# -- eval runs with quality ---------------------------------------------------------------------------


def run_eval(tmp_path: Path, overrides: list[str]) -> tuple[dict, list[dict]]:
    from specbench.tasks.eval import EvalTask

    out = tmp_path / "out"
    cfg = compose_config(
        [*TINY, "gen.max_new_tokens=6", "eval.warmup=false", f"eval.output_dir={out}", *overrides]
    )
    metrics = EvalTask(cfg).run()
    assert json.loads((out / "metrics.json").read_text()) == pytest.approx(metrics)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return metrics, samples


def test_eval_run_with_exact_match_quality(tmp_path, fixture_file, capsys):
    metrics, samples = run_eval(tmp_path, ["dataset=gsm8k", f"dataset.path={fixture_file('gsm8k')}"])
    assert metrics["quality_metric"] == "exact_match" and metrics["quality_num_scored"] == 2
    assert metrics["quality_exact_match"] == pytest.approx(sum(s["score"] for s in samples) / 2)
    assert metrics["dataset_metric"] == "exact_match" and metrics["dataset_source"].endswith("gsm8k.jsonl")
    assert {"tau", "tokens_per_s", "speedup"} <= metrics.keys()  # quality sits beside tau and speed
    assert [s["reference"] for s in samples] == [r["answer"] for r in FIXTURES["gsm8k"]]
    assert all(s["score"] in (0.0, 1.0) and "target" in s["score_details"] for s in samples)
    assert metrics["prompt_format"] == "chat"
    assert "quality: exact_match" in capsys.readouterr().out


def test_eval_run_with_pass_at_1_on_a_base_model_prompt(tmp_path):
    metrics, samples = run_eval(
        tmp_path,
        [
            "dataset=humaneval",
            "dataset.limit=2",
            "dataset.prompt_format=plain",
            "method=auto",
            "model/drafter=none",
        ],
    )
    assert metrics["prompt_format"] == "plain" and metrics["quality_num_scored"] == 2
    assert metrics["quality_pass@1"] == 0.0  # a random model writes no working code
    assert metrics["quality_sandbox"] in ("namespaces", "preamble")
    assert all(s["score"] == 0.0 and s["score_details"]["status"] in ("failed", "timeout") for s in samples)
    assert samples[0]["reference"].rstrip().endswith("check(has_close_elements)")


def test_eval_run_without_scoring_and_without_metric(tmp_path, fixture_file):
    metrics, samples = run_eval(
        tmp_path, ["dataset=gsm8k", f"dataset.path={fixture_file('gsm8k')}", "scoring.enabled=false"]
    )
    assert not any(k.startswith("quality_") for k in metrics) and "score" not in samples[0]
    metrics, samples = run_eval(tmp_path / "demo", ["dataset.limit=2"])
    assert not any(k.startswith("quality_") for k in metrics) and metrics["dataset_metric"] == "none"


def test_config_yaml_records_the_dataset(tmp_path, fixture_file):
    _, _ = run_eval(tmp_path, ["dataset=xsum", f"dataset.path={fixture_file('xsum')}", "dataset.limit=1"])
    saved = OmegaConf.load(tmp_path / "out" / "config.yaml")
    assert (saved.dataset.hf_id, saved.dataset.metric, saved.scoring.isolation) == (
        "EdinburghNLP/xsum",
        "rouge",
        "auto",
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("prompts.jsonl", None, "is a directory, not a prompt file"),
        ("prompts.jsonl", b"", "is empty (0 bytes)"),
        (
            "prompts.jsonl",
            b'{"prompt": "a"}\n{"prompt": "b"}\n\x7fELF\x00\x00',
            ":3: not a text file (a NUL byte at column 5)",
        ),
        (
            "prompts.jsonl",
            b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n',
            ":2: not UTF-8 text (byte 0xe9 at column 16)",
        ),
        ("prompts.jsonl.gz", b'{"prompt": "a"}\n', "is not gzip-compressed"),
        ("prompts.parquet", b'{"prompt": "a"}\n', "is not a parquet file"),
    ],
)
def test_a_prompt_file_that_cannot_be_read_names_the_file_and_line(name, content, message, tmp_path):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    dataset = "parquet" if name.endswith(".parquet") else "jsonl"
    cfg = compose_config([*TINY, f"dataset={dataset}", f"dataset.path={path}"])
    with pytest.raises(ConfigError) as info:
        validate(cfg)  # before any model, and before torch is imported (tests/test_startup.py)
    text = str(info.value)
    assert text.startswith("dataset.path: ") and str(path) in text and message in text and "\n" not in text


def test_a_prompt_file_error_from_launch_is_one_line_with_exit_2(tmp_path):
    proc = launch([*TINY, "dataset=jsonl", f"dataset.path={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"Config error: dataset.path: '{tmp_path}' is a directory, not a prompt file; pass a .jsonl / .json "
        "file "
        "(optionally .gz), a .parquet file or a datasets save_to_disk directory"
    )
