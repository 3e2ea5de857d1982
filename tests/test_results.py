"""Result records (specbench/results): the schema holds when written and read, a bad file is an error that
names it, intervals cover what they should, and the committed tables are what the records render."""

from __future__ import annotations

import json
import statistics

import pytest

from specbench.results import record as records
from specbench.results.__main__ import main as results_main
from specbench.results.record import (
    ResultRecordError,
    bootstrap_interval,
    figure,
    latest_rows,
    load_record,
    load_records,
    make_record,
    validate_record,
    write_record,
)
from specbench.results.render import (
    BEGIN,
    END,
    format_figure,
    render_readme_table,
    render_results_page,
    rendered,
)

MACHINE = {
    "cpu": "Test CPU",
    "cores": 2,
    "threads": 1,
    "torch": "2.13.0",
    "device": "cpu",
    "dtype": "float32",
}
PROMPTS = {"set": "spec_bench heldout", "count": 4}


def _record(date: str, speedup: float, setup: str = "fallback", **extra):
    rows = [
        {"setup": "autoregressive", "figures": {"tokens_per_s": figure(10.0)}, "identical_outputs": True},
        {"setup": setup,
         "figures": {"speedup": figure(speedup, [1.1, 1.3, 1.6, 1.2], unit="x"), "tau": figure(1.5)},
         "identical_outputs": True, "headline": True},
    ]  # fmt: skip
    return make_record("eagle3", "python benchmarks/eagle3.py --per-task 1", dict(MACHINE), dict(PROMPTS),
                       rows, commit="0123456789abcdef", date=date, **extra)  # fmt: skip


def test_bootstrap_interval_brackets_the_statistic_and_narrows_with_more_data():
    values = [1.0, 1.2, 1.4, 1.1, 1.9, 1.3, 1.25, 1.05]
    low, high = bootstrap_interval(values)
    assert low <= statistics.mean(values) <= high and low >= min(values) and high <= max(values)
    wide = high - low
    low, high = bootstrap_interval(values * 16)
    assert high - low < wide / 2  # 16x the questions: about a quarter of the width
    assert bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="two values"):
        bootstrap_interval([1.0])


def test_figure_adds_median_and_interval_only_over_several_questions():
    assert figure(1.5) == {"value": 1.5}
    fig = figure(1.3, [1.0, 1.2, 1.7], unit="x")
    assert fig["median"] == 1.2 and fig["unit"] == "x" and fig["interval"][0] <= 1.3 <= fig["interval"][1]
    assert format_figure(fig).startswith("1.30× (median 1.20×, 95 % CI ")


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda r: r.pop("command"), "missing keys \\['command'\\]"),
        (lambda r: r.update(schema="other/1"), "schema must be"),
        (lambda r: r.update(benchmark="Has Spaces"), "benchmark must be a lower-case name"),
        (lambda r: r.update(date="yesterday"), "date must be ISO 8601"),
        (lambda r: r["machine"].pop("torch"), "machine must be an object with"),
        (lambda r: r["prompts"].update(count=0), "prompts.count must be a positive integer"),
        (lambda r: r.update(rows=[]), "rows must be a non-empty list"),
        (lambda r: r["rows"][1]["figures"]["tau"].update(value="1.5"), "tau.*value must be a number"),
        (lambda r: r["rows"][1]["figures"]["speedup"].update(interval=[2.0, 1.0]), "low <= high"),
        (lambda r: r["rows"][1].update(identical_outputs="yes"), "identical_outputs must be"),
        (lambda r: r["rows"][1].update(setup="autoregressive"), "two rows share a setup name"),
        (lambda r: r.update(extra=1), "unknown keys \\['extra'\\]"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_problem(edit, problem):
    record = _record("2026-12-01T10:00:00Z", 1.4)
    edit(record)
    with pytest.raises(ResultRecordError, match=problem):
        validate_record(record)


def test_write_then_load_round_trips_and_never_overwrites(tmp_path):
    first = write_record(_record("2026-12-01T10:00:00Z", 1.4), tmp_path)
    second = write_record(_record("2026-12-01T10:00:00Z", 1.5), tmp_path)  # same date and commit
    assert first != second and first.parent == tmp_path / "eagle3"
    assert load_record(first)["rows"][1]["figures"]["speedup"]["value"] == 1.4
    assert load_record(second)["rows"][1]["figures"]["speedup"]["value"] == 1.5
    assert not list(tmp_path.rglob("*.partial"))


def test_a_corrupt_or_invalid_file_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "eagle3" / "bad.json"
    bad.parent.mkdir()
    bad.write_text('{"schema": ')
    with pytest.raises(ResultRecordError, match=f"{bad}: unreadable result record"):
        load_records(tmp_path)
    bad.write_text(json.dumps({"schema": records.RECORD_SCHEMA}))
    with pytest.raises(ResultRecordError, match=f"{bad}: missing keys"):
        load_records(tmp_path)


def test_the_latest_run_of_each_setup_wins(tmp_path):
    write_record(_record("2026-12-02T10:00:00Z", 1.6), tmp_path)
    write_record(_record("2026-12-01T10:00:00Z", 1.4, setup="old only"), tmp_path)
    write_record(_record("2026-11-30T10:00:00Z", 1.2), tmp_path)
    rows = latest_rows(load_records(tmp_path))
    picked = {row["setup"]: (record["date"], row) for _, record, row in rows}
    assert set(picked) == {"autoregressive", "fallback", "old only"}
    assert picked["fallback"][0] == "2026-12-02T10:00:00Z"
    assert picked["autoregressive"][0] == "2026-12-02T10:00:00Z"  # the 12-01 run also had one, older
    readme = render_readme_table(load_records(tmp_path))
    assert "| eagle3 | fallback | 1.60× (median" in readme and "1.20×" not in readme.split("old only")[0]
    page = render_results_page(load_records(tmp_path))
    assert page.count("python benchmarks/eagle3.py --per-task 1") == 2  # two runs hold latest rows
    assert "| old only | speedup 1.40× (median" in page and "| 2 |" in page


def test_runs_of_one_date_and_commit_count_in_the_order_they_were_written(tmp_path):
    for speedup in (1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0):  # files X, X-2, ..., X-10
        write_record(_record("2026-12-01T10:00:00Z", speedup), tmp_path)
    (_, _, row), *_ = [item for item in latest_rows(load_records(tmp_path)) if item[2]["setup"] == "fallback"]
    assert row["figures"]["speedup"]["value"] == 2.0


def test_the_cli_renders_checks_and_reports_a_bad_record(tmp_path, monkeypatch, capsys):
    from specbench.results import render

    readme, page = tmp_path / "README.md", tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    for path in (readme, page):
        path.write_text(f"# title\n{BEGIN}\nstale\n{END}\nafter\n")
    results = tmp_path / "results"
    write_record(_record("2026-12-02T10:00:00Z", 1.6), results)
    monkeypatch.setattr(render, "README", readme)
    monkeypatch.setattr(render, "RESULTS_PAGE", page)
    monkeypatch.setattr(render, "ROOT", tmp_path)
    monkeypatch.setattr(records, "RESULTS_DIR", results)
    monkeypatch.setattr("specbench.results.__main__.ROOT", tmp_path)
    monkeypatch.setattr("specbench.results.__main__.rendered", lambda: render.rendered(results))
    monkeypatch.setattr("specbench.results.__main__.load_records", lambda: load_records(results))
    assert results_main(["check"]) == 1
    assert results_main(["render"]) == 0
    assert results_main(["check"]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n") and text.endswith("after\n") and "stale" not in text
    assert "1.60×" in text
    (results / "eagle3" / "broken.json").write_text("[]")
    assert results_main(["check"]) == 2
    assert "broken.json: a record must be a JSON object" in capsys.readouterr().err


def test_committed_tables_are_what_the_records_render():
    for path, text in rendered().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path} differs from what results/ renders: run python -m specbench.results render"
        )


def test_a_newer_run_that_marks_headlines_replaces_the_older_runs_choice(tmp_path):
    write_record(_record("2026-12-01T10:00:00Z", 1.4, setup="old name"), tmp_path)
    assert "| eagle3 | old name | 1.40×" in render_readme_table(load_records(tmp_path))
    write_record(_record("2026-12-02T10:00:00Z", 1.6, setup="new name"), tmp_path)
    readme = render_readme_table(load_records(tmp_path))
    assert "| eagle3 | new name | 1.60×" in readme and "old name" not in readme
    assert "old name" in render_results_page(load_records(tmp_path))  # still the latest row of its setup


def _eval_run(tmp_path, match_rate=1.0):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- model/drafter=early-exit\n- gen.max_new_tokens=16\n")
    samples = [  # per prompt: method 2 tokens/s faster on the first, slower on the second
        {"output_ids": [1] * 10, "wall_time_s": 1.0, "tokens_per_s": 10.0, "baseline_new_tokens": 10,
         "baseline_wall_time_s": 2.0, "baseline_tokens_per_s": 5.0},
        {"output_ids": [1] * 30, "wall_time_s": 1.0, "tokens_per_s": 30.0, "baseline_new_tokens": 30,
         "baseline_wall_time_s": 1.0, "baseline_tokens_per_s": 30.0},
    ]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    metrics = {"method": "sd", "schedule": "constant", "gamma": 3, "drafter": "d", "tau": 1.2,
               "acceptance_rate": 0.1, "tokens_per_s": 20.0, "baseline_tokens_per_s": 40 / 3, "speedup": 1.5,
               "baseline_match_rate": match_rate, "dataset": "demo", "num_samples": 2, "device": "cpu",
               "dtype": "float32", "num_threads": 1}  # fmt: skip
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def test_an_eval_run_becomes_a_record_with_its_launch_command_and_spread(tmp_path):
    from specbench.results.from_eval import main, record_from_eval

    record = record_from_eval(_eval_run(tmp_path), "demo", headline=True)
    assert record["command"] == "python launch.py model/drafter=early-exit gen.max_new_tokens=16"
    base, method = record["rows"]
    assert base["setup"] == "autoregressive" and base["figures"]["tokens_per_s"]["value"] == pytest.approx(
        40 / 3
    )
    assert method["setup"] == "sd (constant, gamma=3), drafter d" and method["headline"] is True
    speedup = method["figures"]["speedup"]
    assert speedup["value"] == 1.5 and speedup["median"] == 2.0  # per-prompt ratios 2.0 and 1.0
    assert speedup["interval"][0] <= 1.5 <= speedup["interval"][1]
    assert method["identical_outputs"] is True
    assert record_from_eval(_eval_run(tmp_path / "b", 0.5))["rows"][1]["identical_outputs"] is False
    assert main([str(_eval_run(tmp_path / "c")), "--results-dir", str(tmp_path / "results")]) == 0
    assert len(load_records(tmp_path / "results")) == 1
    (tmp_path / "c" / "run" / "metrics.json").write_text("{")
    assert main([str(tmp_path / "c" / "run"), "--results-dir", str(tmp_path / "results")]) == 2
