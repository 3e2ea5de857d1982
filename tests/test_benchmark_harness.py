"""benchmarks/harness.py's round figures: per-position acceptance and the drafting share of decoding time."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from harness import acceptance_by_position, round_figures


def answer(drafted, accepted, draft_time=0.0, verify_time=0.0):
    choice = {"drafted": drafted, "accepted": accepted, "draft_time": draft_time, "verify_time": verify_time}
    return {"choices": [choice]}


def test_acceptance_at_position_k_is_conditional_on_reaching_it():
    rows = [answer([3, 3, 1, 0], [3, 1, 0, 0]), answer([2, 4], [0, 2])]
    # position 1: drafted in 5 rounds, accepted in 3 (3, 1, 2) -> 3/5
    # position 2: reached (drafted >= 2 and accepted >= 1) in rounds (3,3), (3,1), (4,2): kept in 2 -> 2/3
    # position 3: reached in (3,3) and (4,2): kept in 1 -> 1/2
    assert acceptance_by_position(rows, 4) == [pytest.approx(0.6), pytest.approx(2 / 3), 0.5, None]


def test_round_figures_give_acceptance_and_draft_share_only_for_speculative_rows():
    rows = [answer([2, 2], [2, 0], draft_time=1.0, verify_time=3.0), answer([1], [1], 0.5, 0.5)]
    figures = round_figures(rows)
    assert figures["acc_pos1"]["value"] == pytest.approx(2 / 3)
    assert figures["acc_pos2"]["value"] == 1.0 and "acc_pos3" not in figures
    assert figures["draft_share"]["value"] == pytest.approx(1.5 / 5.0)
    assert round_figures([{"choices": [{"new_tokens": [3]}]}]) == {}


def test_the_shared_parser_adds_the_common_flags_a_script_names_and_the_record_options():
    from harness import COMMON_FLAGS, benchmark_parser

    parser = benchmark_parser("doc", per_task=3, threads=1, out_dir={"default": None, "help": "where"})
    args = parser.parse_args(["--per-task", "5"])
    assert (args.per_task, args.threads, args.out_dir, args.no_record, args.headline) == (
        5,
        1,
        None,
        False,
        "",
    )
    assert not hasattr(args, "max_new_tokens")  # not named: not taken
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "float32"])
    with pytest.raises(ValueError, match="no common benchmark flag"):
        benchmark_parser("doc", per_tsk=3)
    assert {"questions", "per_task", "per_category", "max_new_tokens", "threads", "dtype"} <= set(
        COMMON_FLAGS
    )


def test_every_benchmark_script_builds_its_parser_from_the_harness():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) > 5
    for script in scripts:
        source = script.read_text(encoding="utf-8")
        if script.name == "harness.py" or "parse_args(" not in source:
            continue
        assert "benchmark_parser(" in source and "ArgumentParser(" not in source, script.name


def test_setups_become_engine_runners_in_order():
    from harness import Setup, setup_runners

    from specbench.drafters.prompt_lookup import PromptLookupDrafter
    from specbench.models.tiny import tiny_random_model

    model = tiny_random_model("llama", seed=0)
    runners = setup_runners(model, [Setup("autoregressive"), Setup("lookup", PromptLookupDrafter())])
    assert [r.name for r in runners] == ["autoregressive", "lookup"]
    plain, lookup = (r.run([5, 6, 7, 5, 6]) for r in runners)
    assert plain.output_ids == lookup.output_ids and len(plain.output_ids) > 0


@pytest.mark.slow
def test_peers_benchmark_records_every_row_with_rounds_that_add_up(tmp_path):
    """benchmarks/peers.py at a tiny size: HF generate / prompt lookup / assisted on a plain-transformers copy
    and specbench's AR and default drafter, one record with per-task figures; every runner's rounds account
    for every token it emitted (the HF rows' rounds are read from the verifier's forward calls)."""
    import json

    import peers

    from specbench.results.record import load_records

    code = peers.main(["--per-category", "1", "--max-new-tokens", "6", "--dtypes", "float32",
                       "--default-schedule", "constant", "--compare-schedule", "cost_aware",
                       "--out-dir", str(tmp_path / "out"),
                       "--results-dir", str(tmp_path / "results")])  # fmt: skip
    assert code == 0
    (_, record), = load_records(tmp_path / "results")
    setups = {row["setup"]: row for row in record["rows"]}
    names = ["hf-generate", "hf-prompt-lookup", "hf-assisted-ee4", "specbench-ar", "specbench-default",
             "specbench-default-cost_aware", "specbench-tree"]  # fmt: skip
    assert sorted(setups) == sorted(f"float32: {n}" for n in names)
    default = setups["float32: specbench-default"]["figures"]
    assert {
        "speedup", "vs_hf_prompt_lookup", "total_time_vs_hf_prompt_lookup", "tau", "same_as_hf_generate",
        "speedup_qa", "acc_pos1", "total_time_vs_hf_prompt_lookup_qa",
    } <= set(default)
    assert setups["float32: hf-generate"]["figures"]["speedup"]["value"] == 1.0
    assert setups["float32: specbench-tree"]["identical_outputs"]  # against specbench's AR
    priced = setups["float32: specbench-default-cost_aware"]
    assert priced["identical_outputs"] and "vs_specbench_ar_qa" in priced["figures"]
    assert "vs_specbench_ar" not in setups["float32: hf-prompt-lookup"]["figures"]
    # total time: the prompt-lookup row's time per token over the row's, on the whole set
    folder = tmp_path / "out" / "float32" / "answers"
    answers = {n: [json.loads(x) for x in (folder / f"{n}.jsonl").read_text().splitlines()]
               for n in ("hf-prompt-lookup", "specbench-default")}  # fmt: skip
    per_token = {n: sum(a["choices"][0]["wall_time"][0] for a in rows) / sum(a["choices"][0]["new_tokens"][0]
                 for a in rows) for n, rows in answers.items()}  # fmt: skip
    expected = per_token["hf-prompt-lookup"] / per_token["specbench-default"]
    assert abs(default["total_time_vs_hf_prompt_lookup"]["value"] - expected) < 1e-9
    for name in names:
        for line in (tmp_path / "out" / "float32" / "answers" / f"{name}.jsonl").read_text().splitlines():
            choice = json.loads(line)["choices"][0]
            assert sum(choice["accept_lengths"]) == choice["new_tokens"][0], name
            assert (
                len(choice["drafted"]) == len(choice["accepted"]) == choice["decoding_steps"][0]
                or not choice["drafted"]
            )
            assert all(0 <= a <= d for d, a in zip(choice["drafted"], choice["accepted"]))


def test_cpu_kernels_benchmark_records_every_shape_and_attention_size(tmp_path, capsys):
    import cpu_kernels

    from specbench.results.record import load_records

    assert cpu_kernels.main(["--repeats", "2", "--results-dir", str(tmp_path)]) == 0
    (_, record), = load_records(tmp_path)
    setups = [row["setup"] for row in record["rows"]]
    shapes = len(cpu_kernels.SHAPES) * len(cpu_kernels.ROWS)
    assert len(setups) == shapes + len(cpu_kernels.QUERIES) * len(cpu_kernels.KEYS)
    assert setups[-1] == f"attention {cpu_kernels.QUERIES[-1]} queries, {cpu_kernels.KEYS[-1]} keys"
    attention = {key: value["value"] for key, value in record["rows"][-1]["figures"].items()}
    assert attention["torch_rowwise_over_sdpa"] == attention["torch_rowwise_ms"] / attention["sdpa_ms"]
    assert attention["kernel_over_sdpa"] == attention["kernel_ms"] / attention["sdpa_ms"]
    assert "LINEAR_PRODUCT on this CPU" in capsys.readouterr().out


def test_synth_throughput_benchmark_puts_batched_next_to_one_stream(tmp_path, capsys):
    import synth_throughput

    from specbench.results.record import load_records

    argv = [
        "--batch-size",
        "3",
        "--single-prompts",
        "2",
        "--max-new-tokens",
        "4",
        "--results-dir",
        str(tmp_path),
    ]
    assert synth_throughput.main(argv) == 0
    ((_, record),) = load_records(tmp_path)
    single, batched = (row["figures"] for row in record["rows"])
    assert single["vs_single_stream"]["value"] == 1.0
    ratio = batched["tokens_per_s"]["value"] / single["tokens_per_s"]["value"]
    assert batched["vs_single_stream"]["value"] == pytest.approx(ratio)
    assert "batch 3" in capsys.readouterr().out


def test_step_profile_splits_a_step_into_its_parts_and_restores_the_model():
    import step_profile
    import torch

    from specbench.models.tiny import tiny_random_model

    model = tiny_random_model(num_layers=2)
    model.config._attn_implementation = "sdpa"

    def decode(ids: list[int]) -> int:
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6, min_new_tokens=6,
                             pad_token_id=0)  # fmt: skip
        return out.shape[1] - len(ids)

    with step_profile.named_ranges([model]):
        parts = step_profile.breakdown(decode, [list(range(3, 40)), list(range(5, 30))])
    assert all(value > 0 for key, value in parts.items() if key != "sampling")
    assert parts["attention"] + parts["cache"] < parts["forward"] < parts["step"]
    assert parts["forward"] + parts["sampling"] + parts["outside"] == pytest.approx(parts["step"])
    assert "forward" not in vars(model.model) and "forward" not in vars(model.lm_head)


def test_kv_cache_benchmark_puts_both_caches_side_by_side(tmp_path, capsys):
    import kv_cache

    from specbench.results.record import load_records

    argv = ["--dtypes", "float32", "--shapes", "2x20", "--steps", "3", "--rounds", "1"]
    assert kv_cache.main([*argv, "--results-dir", str(tmp_path)]) == 0
    ((_, record),) = load_records(tmp_path)
    (row,) = record["rows"]
    figures = row["figures"]
    ratio = figures["dynamic_step_ms"]["value"] / figures["buffered_step_ms"]["value"]
    assert figures["dynamic_over_buffered"]["value"] == pytest.approx(ratio)
    assert row["identical_outputs"] is True  # the same greedy tokens from either cache
    assert "float32" in capsys.readouterr().out


def test_scaling_benchmark_records_tau_against_training_tokens_and_redraws_the_plot(tmp_path):
    """benchmarks/eagle3_scaling.py at a tiny size: two scaling runs (copies of the committed head with their
    training tokens rewritten) as chain and tree rows next to autoregressive decoding; each head row carries
    its tokens and objective, greedy outputs equal AR's, and the record alone redraws the plot."""
    import eagle3_scaling
    import torch

    from specbench.results.record import load_records

    committed = torch.load(ROOT / "checkpoints/eagle3-smollm2-135m/trained.pt", map_location="cpu",
                           weights_only=False)  # fmt: skip
    for name, tokens in (("sft-1000", 1000), ("opd-3000", 3000), ("base-1000", 500)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        meta = {**committed["specbench"], "train_generated_tokens": tokens, "global_step": tokens // 10}
        torch.save({**committed, "specbench": meta}, tmp_path / "runs" / name / "trained.pt")
    plot = tmp_path / "scaling.png"
    code = eagle3_scaling.main([
        "--runs", str(tmp_path / "runs"), "--per-task", "1", "--max-new-tokens", "4", "--gamma", "2",
        "--tree", "2x2", "--dtype", "float32", "--plot", str(plot), "--out-dir", str(tmp_path / "out"),
        "--results-dir", str(tmp_path / "results"),
    ])  # fmt: skip
    assert code == 0
    ((_, record),) = load_records(tmp_path / "results")
    rows = {row["setup"]: row for row in record["rows"]}
    assert sorted(rows) == ["autoregressive", "opd-3000-chain-g2", "opd-3000-tree-g2-w2", "sft-1000-chain-g2",
                            "sft-1000-tree-g2-w2"]  # base-* is the runs' common start, not a point
    opd = rows["opd-3000-tree-g2-w2"]
    assert opd["figures"]["train_tokens"]["value"] == 3000 and opd["figures"]["train_steps"]["value"] == 300
    assert opd["notes"].startswith("objective opd;") and rows["sft-1000-chain-g2"]["notes"].startswith(
        "objective sft;")
    assert all(row["identical_outputs"] for row in record["rows"])
    assert plot.stat().st_size > 0
    plot.unlink()
    record_file = next((tmp_path / "results").rglob("*.json"))
    assert eagle3_scaling.main(["--plot-only", str(record_file), "--plot", str(plot)]) == 0
    assert plot.stat().st_size > 0
    # a curve measured in two runs (sizes trained in different sessions) draws as one line per objective
    later = json.loads(json.dumps(record))
    for row in later["rows"]:
        if "train_tokens" in row["figures"]:
            row["figures"]["train_tokens"]["value"] *= 100
    lines = eagle3_scaling.curve_lines([record, later])
    assert lines[("opd", "tree")] == [(3000, opd["figures"]["tau"]["value"]),
                                      (300000, opd["figures"]["tau"]["value"])]
    assert [tokens for tokens, _ in lines[("sft", "chain")]] == [1000, 100000]
