"""Config composition (every option of every group), schema checks at compose time, and validate()."""

from __future__ import annotations

import pytest
from helpers import ROOT, compose_config, launch
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError, DatasetNotFoundError, MethodConfig, SteeringConfig, validate
from specbench.decoding.rules import CascadeRule, EnsembleRule, LenientRule, TypicalRule, VerificationRule

CONF = ROOT / "conf"
TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random"]
GROUPS = ["task", "model/verifier", "model/drafter", "method", "steering", "schedule", "dataset"]
# Options that need another group or a checkpoint to decode: validate names what is missing.
NEEDS_MORE = {
    # A method's yaml picks the drafter it needs (conf/method/<name>.yaml); what is left is the trained part.
    ("method", "distill"): "needs method.drafter_checkpoint=PATH",
    ("method", "eagle3"): "model.drafter.params.path is null.*model/drafter=eagle3-smollm2",
    ("model/drafter", "eagle3"): "model.drafter.params.path",
    ("method", "dflash"): "model.drafter.params.path is null",
    ("method", "eagle3_opd"): "model.drafter.params.path is null.*model/drafter=eagle3-smollm2",
    ("method", "dflash_opd"): "model.drafter.params.path is null",
    ("model/drafter", "dflash"): "model.drafter.params.path is null",
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


HUB_DATASETS = ("alpaca", "cnndm", "gsm8k", "mbpp", "ultrachat", "wmt", "xsum")
ALL_OPTIONS = [(group, option) for group in GROUPS for option in options(group)]


def test_expected_options_exist():
    assert options("model/verifier") == [
        "llama-3.1-8b-instruct",
        "llama-3.3-70b-instruct",
        "qwen3-14b",
        "qwen3-8b",
        "smollm2-135m",
        "tiny-random",
        "vicuna-13b-v1.3",
    ]
    assert options("model/drafter") == [
        "dflash",
        "eagle3",
        "eagle3-smollm2",
        "early-exit",
        "llama-160m",
        "llama-3.2-1b-instruct",
        "ngram",
        "none",
        "prompt-lookup",
        "prompt-lookup-spec-bench",
        "qwen3-0.6b",
        "suffix",
        "suffix-eagle3-smollm2",
        "suffix-pl-eagle3-smollm2",
        "suffix-smollm2",
        "tiny-random",
    ]
    assert options("method") == [
        "auto",
        "block",
        "cascade",
        "dflash",
        "dflash_opd",  # aliases of dflash / eagle3 with method.objective=opd (on-policy distillation)
        "distill",
        "diversed",
        "eagle3",
        "eagle3_opd",
        "fly",
        "lossy",
        "sd",
        "sd2",
        "sd_en",  # aliases (conf/method/<alias>.yaml) of diversed, lossy, static_ensemble, cascade
        "sd_lossy",
        "sd_static",
        "spe_cas",
        "static_en",
        "static_ensemble",
        "typical",
    ]
    assert options("steering") == ["none", "sd2"]
    assert options("schedule") == ["constant", "cost_aware", "dynamic", "heuristic"]
    assert options("dataset") == [
        "alpaca", "chatterbot", "cnndm", "corpus", "demo", "gsm8k", "humaneval", "inspect_evals", "jsonl",
        "leetcode", "mbpp", "mt_bench", "openai_evals", "parquet", "spec_bench", "ultrachat", "wmt", "xsum",
    ]  # fmt: skip
    assert options("task") == ["eval", "profile", "report", "synth", "train"]


def test_defaults():
    cfg = compose_config()
    assert cfg.task._target_ == "specbench.tasks.eval.EvalTask"
    assert cfg.model.verifier.kind == "embedded"
    # the fastest lossless drafter measured on the embedded pair, at its own draft length
    assert (cfg.model.drafter.kind, cfg.model.drafter.name) == ("drafter", "suffix-eagle3-smollm2-135m")
    assert cfg.method.name == "sd"
    assert (cfg.schedule.name, cfg.schedule.gamma) == ("constant", 10)
    early = compose_config(["model/drafter=early-exit"])  # the teaching drafter keeps gamma 3
    assert (early.model.drafter.kind, early.model.drafter.num_layers, early.schedule.gamma) == (
        "early_exit",
        4,
        3,
    )
    assert compose_config(["model/drafter=early-exit", "schedule.gamma=5"]).schedule.gamma == 5
    assert cfg.dataset.name == "demo"
    assert OmegaConf.to_container(cfg.gen) == {
        "max_new_tokens": 64,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "seed": 0,
        "batch_size": 1,
    }
    assert OmegaConf.to_container(cfg.eval) == {
        "baseline": True,
        "warmup": True,
        "output_dir": None,
        "num_shards": 1,
        "shard_id": 0,
        "resume": True,
    }
    assert OmegaConf.to_container(cfg.tracking) == {
        "enabled": True,
        "uri": None,
        "experiment": None,
        "run_name": None,
        "tags": {},
    }
    assert OmegaConf.to_container(cfg.runtime) == {
        "device": "auto", "dtype": "auto", "num_threads": None, "tp_plan": None,
    }  # fmt: skip
    assert OmegaConf.get_type(cfg.method) is MethodConfig


@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_every_option_composes_and_validates(group, option):
    overrides = [f"{group}={option}"]
    if group == "model/drafter" and option == "none":
        overrides.append("method=auto")
    if group == "dataset" and option in ("jsonl", "parquet"):
        overrides.append(f"dataset.path={ROOT / 'specbench/data/demo_prompts.jsonl'}")
    cfg = compose_config(overrides)
    if (
        group == "dataset" and option in HUB_DATASETS
    ):  # offline here; tests/test_datasets.py uses local copies
        with pytest.raises(DatasetNotFoundError, match="dataset.path="):
            validate(cfg)
        return
    if group.startswith("model/") and cfg.model[group.split("/")[1]].kind == "hub":
        with pytest.raises(ConfigError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE=1"):
            validate(cfg)  # offline: tests/test_models.py loads hub code paths from local copies
        return
    if (group, option) in NEEDS_MORE:
        with pytest.raises(ConfigError, match=NEEDS_MORE[group, option]):
            validate(cfg)
        return
    plan = validate(cfg)
    if group == "model/verifier":
        assert plan.verifier.kind == cfg.model.verifier.kind
    if group == "model/drafter" and option != "none":
        assert plan.drafter.kind == cfg.model.drafter.kind


def test_hub_models_carry_real_ids():
    for option, hub_id in [
        ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("qwen3-8b", "Qwen/Qwen3-8B"),
        ("qwen3-14b", "Qwen/Qwen3-14B"),
        ("vicuna-13b-v1.3", "lmsys/vicuna-13b-v1.3"),
    ]:
        node = compose_config([f"model/verifier={option}"]).model.verifier
        assert (node.kind, node.path) == ("hub", hub_id)
    for option, hub_id in [
        ("llama-3.2-1b-instruct", "meta-llama/Llama-3.2-1B-Instruct"),
        ("qwen3-0.6b", "Qwen/Qwen3-0.6B"),
        ("llama-160m", "JackFram/llama-160m"),
    ]:
        node = compose_config([f"model/drafter={option}"]).model.drafter
        assert (node.kind, node.path) == ("hub", hub_id)


def test_tiny_pair_uses_different_seeds():
    cfg = compose_config(TINY)
    assert cfg.model.verifier.kind == cfg.model.drafter.kind == "tiny_random"
    assert cfg.model.verifier.seed != cfg.model.drafter.seed


@pytest.mark.parametrize(
    ("method", "rule_type", "params"),
    [
        ("sd", VerificationRule, {}),
        ("lossy", LenientRule, {"lenience": 0.5}),
        ("static_ensemble", EnsembleRule, {"draft_weight": 0.3, "pool": "linear"}),
        ("cascade", CascadeRule, {"deferral": "chow", "alpha": 0.1}),
        ("typical", TypicalRule, {"epsilon": 0.09, "delta": 0.3}),
    ],
)
def test_method_options_build_their_rules(method, rule_type, params):
    plan = validate(compose_config([*TINY, f"method={method}"]))
    assert type(plan.rule) is rule_type
    assert plan.method == method
    for key, value in params.items():
        assert getattr(plan.rule, key) == pytest.approx(value)


def test_method_auto_needs_no_drafter():
    plan = validate(compose_config([*TINY, "method=auto", "model/drafter=none"]))
    assert plan.rule is None and plan.drafter is None and plan.method == "auto"
    assert validate(compose_config([*TINY, "method=auto"])).drafter is None


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("sd_static", "static_ensemble"),
        ("sd_lossy", "lossy"),
        ("spe_cas", "cascade"),
        ("static_en", "static_ensemble"),
    ],
)
def test_diversed_method_aliases(alias, canonical):
    plan = validate(compose_config([*TINY, f"method={canonical}", f"method.name={alias}"]))
    assert plan.method == canonical


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["method=sd2", "steering=none"], "method=sd2 decodes with an SD²-steered drafter: add steering=sd2"),
        (["method=distill"], "method=distill needs method.drafter_checkpoint=PATH"),
        (
            ["method=distill", "steering=sd2"],
            "method=distill decodes with a distilled drafter and no steering",
        ),
        (["method=auto", "steering=sd2"], "steering=sd2 steers a drafter, but method=auto has none"),
    ],
)
def test_trained_methods_say_what_they_miss(overrides, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_config([*TINY, *overrides]))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.drafter.params.tree_width=0"], "model.drafter.params.tree_width=0: an integer >= 1"),
        (
            ["model.drafter.params.tree_width=3", "method=lossy"],
            "model.drafter.params.tree_width=3: trees of drafts",
        ),
    ],
)
def test_a_tree_width_is_checked_against_the_rule_before_any_model_loads(overrides, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_config(["model/drafter=eagle3-smollm2", *overrides]))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    plan = validate(compose_config(["model/drafter=eagle3-smollm2", "model.drafter.params.tree_width=3"]))
    assert plan.method == "sd"


def test_a_model_drafter_takes_a_tree_width_for_the_exact_rule_only():
    plan = validate(compose_config(["model/drafter=early-exit", "model.drafter.tree_width=3"]))
    assert plan.drafter.tree_width == 3
    with pytest.raises(
        ConfigError, match=r"^model.drafter.tree_width=3: trees of drafts .* not method=typical"
    ):
        validate(compose_config(["model/drafter=early-exit", "model.drafter.tree_width=3", "method=typical"]))
    with pytest.raises(ConfigError, match=r"^model.drafter.tree_width=-1: an integer >= 1"):
        validate(compose_config(["model/drafter=early-exit", "model.drafter.tree_width=-1"]))


def test_trained_methods_validate_with_their_parts():
    plan = validate(compose_config([*TINY, "method=sd2", "steering=sd2"]))
    assert (plan.method, plan.checkpoint, plan.steering["v_layers"]) == ("sd2", None, [3, 16, 29])
    assert isinstance(plan.rule, VerificationRule) and plan.rule.lossless
    plan = validate(compose_config([*TINY, "method.name=sd_en"]))
    assert (plan.method, plan.rule, plan.pool) == ("diversed", None, "linear")
    plan = validate(compose_config([*TINY, "steering=sd2"]))  # a steered drafter under another rule
    assert plan.method == "sd" and plan.steering is not None


def test_a_method_missing_its_checkpoint_fails_before_the_eval_task_loads_or_writes(tmp_path):
    from specbench.tasks.eval import EvalTask

    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="drafter_checkpoint"):
        EvalTask(compose_config([*TINY, "method=distill", f"eval.output_dir={out}"])).run()
    assert not out.exists()


def test_steering_and_planned_method_fields():
    cfg = compose_config(["steering=sd2", "method=diversed"])
    assert OmegaConf.get_type(cfg.steering) is SteeringConfig
    assert OmegaConf.to_container(cfg.steering) == {
        "name": "sd2",
        "v_layers": [3, 16, 29],
        "guide_method": "merged",
        "d_layers": "all",
        "rank": None,
        "finetune_drafter": "full",
        "checkpoint": None,
    }
    assert (cfg.method.pool, cfg.method.head_checkpoint) == ("linear", None)
    assert compose_config().steering.name == "none"
    cfg = compose_config(
        ["steering=sd2", "steering.d_layers=[0,2]", "steering.rank=64", "steering.guide_method=simple"]
    )
    assert (list(cfg.steering.d_layers), cfg.steering.rank, cfg.steering.guide_method) == (
        [0, 2],
        64,
        "simple",
    )
    assert compose_config(["method=distill"]).method.drafter_checkpoint is None


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["steering.name=magic"], "steering.name"),
        (["steering=sd2", "steering.v_layers=[3,16]"], "steering.v_layers"),
        (["steering=sd2", "steering.v_layers=[16,3,29]"], "steering.v_layers"),
        (["steering=sd2", "steering.v_layers=[-1,3,29]"], "steering.v_layers"),
        (["steering=sd2", "steering.guide_method=fused"], "steering.guide_method"),
        (["steering=sd2", "steering.d_layers=some"], "steering.d_layers"),
        (["steering=sd2", "steering.d_layers=[0,0]"], "steering.d_layers"),
        (["steering=sd2", "steering.d_layers=[]"], "steering.d_layers"),
        (["steering=sd2", "steering.rank=0"], "steering.rank"),
        (["steering=sd2", "steering.finetune_drafter=half"], "steering.finetune_drafter"),
        (["steering=sd2", "steering.checkpoint=/no/such/steering.pt"], "steering.checkpoint"),
        (["method=diversed", "method.pool=geometric"], "method.pool"),
        (["method=diversed", "method.head_checkpoint=/no/such/head.pt"], "method.head_checkpoint"),
        (["method=distill", "method.drafter_checkpoint=/no/such/dir"], "method.drafter_checkpoint"),
    ],
)
def test_bad_steering_and_planned_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate(compose_config([*TINY, *overrides]))
    message = str(info.value)
    assert message.startswith(key) and "not implemented" not in message and "\n" not in message


@pytest.mark.parametrize(
    "override",
    ["steering.v_layer=[1,2,3]", "steering.rank=big", "method.head_checkpont=x", "task.sweepdir=x"],
)
def test_typos_in_new_groups_fail_at_compose_time(override):
    with pytest.raises(ConfigCompositionException):
        compose_config(["task=report", override])


def test_report_task_config():
    cfg = compose_config(["task=report", "task.sweep_dir=/tmp/x", "task.tags={specbench.method:sd,team:a}"])
    assert cfg.task._target_ == "specbench.tasks.report.ReportTask"
    assert (cfg.task.sweep_dir, cfg.task.experiment, cfg.task.max_runs) == ("/tmp/x", "specbench-eval", 1000)
    assert OmegaConf.to_container(cfg.task.tags) == {"specbench.method": "sd", "team": "a"}


def test_schedules_and_overrides():
    plan = validate(compose_config([*TINY, "schedule=dynamic"]))
    assert (plan.schedule.name, plan.schedule.max_gamma, plan.schedule.confidence_threshold) == (
        "dynamic",
        8,
        0.4,
    )
    assert validate(compose_config([*TINY, "schedule=heuristic"])).schedule.name == "heuristic"
    plan = validate(
        compose_config(
            [
                *TINY,
                "schedule.gamma=5",
                "gen.max_new_tokens=7",
                "gen.temperature=0.7",
                "gen.top_p=0.9",
                "gen.top_k=20",
                "gen.seed=3",
                "gen.batch_size=4",
            ]
        )
    )
    assert plan.schedule.gamma == 5
    assert (plan.settings.max_new_tokens, plan.settings.temperature, plan.settings.top_p) == (7, 0.7, 0.9)
    assert (plan.settings.top_k, plan.settings.seed, plan.batch_size) == (20, 3, 4)


@pytest.mark.parametrize(
    "override",
    [
        "method.lenence=0.5",
        "gen.max_new_token=3",
        "model.verifier.kindd=hub",
        "schedule.gama=2",
        "eval.basline=false",
        "schedule.gamma=three",
        "gen.batch_size=1.5",
        "eval.baseline=maybe",
        "schedule.learn_costs=maybe",
    ],
)
def test_typos_and_wrong_types_fail_at_compose_time(override):
    with pytest.raises(ConfigCompositionException):
        compose_config([override])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["schedule.gamma=0"], "schedule.gamma"),
        (["schedule.gamma=-2"], "schedule.gamma"),
        (["schedule=dynamic", "schedule.gamma=10"], "schedule.max_gamma"),
        (["schedule.confidence_threshold=1.5"], "schedule.confidence_threshold"),
        (["schedule.name=sometimes"], "schedule.name"),
        (["method.name=bogus"], "method.name"),
        (["method=lossy", "method.lenience=1.5"], "method.lenience"),
        (["method=lossy", "method.lenience=0"], "method.lenience"),
        (["method=static_ensemble", "method.draft_weight=1.2"], "method.draft_weight"),
        (["method=static_ensemble", "method.draft_weight=-0.1"], "method.draft_weight"),
        (["method=static_ensemble", "method.pool=geometric"], "method.pool"),
        (["method=cascade", "method.deferral=maybe"], "method.deferral"),
        (["method=typical", "method.epsilon=0"], "method.epsilon"),
        (["gen.max_new_tokens=0"], "gen.max_new_tokens"),
        (["gen.temperature=-1"], "gen.temperature"),
        (["gen.top_p=1.5"], "gen.top_p"),
        (["gen.top_k=-1"], "gen.top_k"),
        (["gen.batch_size=0"], "gen.batch_size"),
        (["runtime.device=tpu"], "runtime.device"),
        (["runtime.dtype=int3"], "runtime.dtype"),
        (["runtime.num_threads=0"], "runtime.num_threads"),
        (["model/drafter=none"], "model.drafter"),
        (["model.verifier.kind=early_exit"], "model.verifier.kind"),
        (["model.verifier.kind=zoo"], "model.verifier.kind"),
        (["model.drafter.kind=zoo"], "model.drafter.kind"),
        (["model.verifier.kind=hub"], "model.verifier.path"),
        (["model.drafter.kind=local", "model.drafter.path=/no/such/dir"], "model.drafter.path"),
        (["model.drafter.kind=early_exit", "model.drafter.num_layers=null"], "model.drafter.num_layers"),
        (["dataset=jsonl"], "dataset.path"),
        (["dataset.limit=0"], "dataset.limit"),
    ],
)
def test_bad_values_fail_in_validate_naming_the_key(overrides, key):
    cfg = compose_config([*TINY, *overrides])
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    assert key in message
    assert "\n" not in message


def test_allowed_values_are_listed():
    with pytest.raises(ConfigError, match=r"allowed: \[.*'sd'.*'sd_static'"):
        validate(compose_config([*TINY, "method.name=bogus"]))
    with pytest.raises(ConfigError, match="method=auto"):
        validate(compose_config([*TINY, "model/drafter=none"]))


def test_missing_dataset_file(tmp_path):
    cfg = compose_config([*TINY, "dataset=jsonl", f"dataset.path={tmp_path / 'absent.jsonl'}"])
    with pytest.raises(DatasetNotFoundError, match="dataset.path") as info:
        validate(cfg)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)
    assert "absent.jsonl" in str(info.value)


def test_schema_is_registered():
    assert "specbench_schema.yaml" in ConfigStore.instance().list("/")


# ---- aliases: one meaning per method, whichever way it was named ------------------------------------------

ALIAS_DEFAULTS = [
    ("sd_en", "diversed", {"pool": "linear"}),
    ("static_en", "static_ensemble", {"draft_weight": 0.3, "pool": "linear"}),
    ("sd_static", "static_ensemble", {"draft_weight": 0.3, "pool": "linear"}),
    ("sd_lossy", "lossy", {"lenience": 0.5}),
    ("spe_cas", "cascade", {"deferral": "chow", "alpha": 0.1}),
]


@pytest.mark.parametrize(("alias", "canonical", "defaults"), ALIAS_DEFAULTS)
@pytest.mark.parametrize("spelling", ["method={}", "method.name={}"])
def test_an_alias_runs_the_canonical_method_with_its_defaults(alias, canonical, defaults, spelling):
    cfg = compose_config([*TINY, spelling.format(alias)])
    plan = validate(cfg)
    assert (plan.method, plan.alias) == (canonical, alias)
    assert (cfg.method.name, cfg.method.alias) == (canonical, alias)  # recorded: canonical name, alias apart
    reference = compose_config([*TINY, f"method={canonical}"])
    validate(reference)
    method = OmegaConf.to_container(cfg.method)
    assert {**method, "alias": None} == OmegaConf.to_container(reference.method)
    assert {k: method[k] for k in defaults} == defaults
    if canonical != "diversed":
        for key, value in defaults.items():
            assert getattr(plan.rule, key) == (pytest.approx(value) if isinstance(value, float) else value)


def test_static_en_is_the_static_ensemble_not_sd():
    """A regression: method.name=static_en once ran with draft weight 0.0 (= sd)."""
    plan = validate(compose_config([*TINY, "method.name=static_en"]))
    assert type(plan.rule) is EnsembleRule and plan.rule.draft_weight == pytest.approx(0.3)


def test_method_name_takes_the_named_methods_defaults_and_clears_the_others():
    cfg = compose_config([*TINY, "method=static_ensemble", "method.name=lossy"])
    plan = validate(cfg)
    assert type(plan.rule) is LenientRule and plan.rule.lenience == pytest.approx(0.5)
    assert (cfg.method.draft_weight, cfg.method.pool, cfg.method.lenience) == (None, None, 0.5)
    explicit = compose_config([*TINY, "method.name=static_en", "method.draft_weight=0.0"])
    assert validate(explicit).rule.draft_weight == 0.0  # a value the user set is kept
    stale = compose_config([*TINY, "method=sd_en", "method.name=lossy"])
    assert validate(stale).alias is None and stale.method.alias is None  # sd_en is no alias of lossy


# ---- trained checkpoints: metadata checked before any model loads ------------------------------------------


def _checkpoint(path, **metadata):
    import torch

    torch.save({"state_dict": {"head.linear.weight": torch.randn(1, 4)}, "specbench": metadata}, path)
    return path


@pytest.fixture
def diversed_checkpoints(tmp_path):
    pair = {"verifier": "tiny-random-llama", "drafter": "tiny-random-llama-drafter"}
    (tmp_path / "junk.pt").write_bytes(b"\x80\x04 certainly not a checkpoint")
    return {
        "good": _checkpoint(tmp_path / "good.pt", method="diversed", **pair),
        "sd2": _checkpoint(tmp_path / "sd2.pt", method="sd2", **pair),
        "other_pair": _checkpoint(
            tmp_path / "other.pt", method="diversed", verifier="big-verifier", drafter="d"
        ),
        "junk": tmp_path / "junk.pt",
    }


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("sd2", "is a method='sd2' checkpoint, not method='diversed'"),
        ("other_pair", ("was trained for verifier 'big-verifier' + drafter 'd', not for model.verifier "
                       "'tiny-random-llama' + model.drafter 'tiny-random-llama-drafter'")),
        ("junk", "is not a specbench checkpoint"),
    ],
)
def test_a_checkpoint_of_another_method_or_pair_or_no_checkpoint_fails_in_validate(
    diversed_checkpoints, which, message, tmp_path
):
    from specbench.tasks.eval import EvalTask

    path = diversed_checkpoints[which]
    out = tmp_path / "out"
    cfg = compose_config(
        [*TINY, "method=diversed", f"method.head_checkpoint={path}", f"eval.output_dir={out}"]
    )
    with pytest.raises(ConfigError) as info:
        EvalTask(cfg).run()
    text = str(info.value)
    assert text.startswith("method.head_checkpoint") and message in text and "\n" not in text
    assert "weights_only" not in text and not out.exists()  # nothing loaded or written


def test_a_matching_checkpoint_validates(diversed_checkpoints):
    plan = validate(
        compose_config([*TINY, "method=diversed", f"method.head_checkpoint={diversed_checkpoints['good']}"])
    )
    assert plan.checkpoint == str(diversed_checkpoints["good"])


SD2_TRAINED = {"v_layers": [1, 2, 3], "guide_method": "simple", "d_layers": [0, 1], "rank": 4, "hidden": 64,
               "out_size": 128}


def _sd2_checkpoint(tmp_path):
    return _checkpoint(
        tmp_path / "sd2.pt", method="sd2", verifier="tiny-random-llama", drafter="tiny-random-llama-drafter",
        steering=SD2_TRAINED, finetune_drafter="none",
    )


def test_steering_values_a_checkpoint_fixes_are_recorded_as_the_checkpoints(tmp_path):
    cfg = compose_config(
        [*TINY, "method=sd2", "steering=sd2", f"steering.checkpoint={_sd2_checkpoint(tmp_path)}"]
    )
    assert cfg.steering.v_layers == [3, 16, 29]  # the steering group's defaults, not what was trained
    plan = validate(cfg)
    steering = OmegaConf.to_container(cfg.steering)
    assert {k: steering[k] for k in ("v_layers", "guide_method", "d_layers", "rank")} == {
        k: SD2_TRAINED[k] for k in ("v_layers", "guide_method", "d_layers", "rank")
    }
    assert steering["finetune_drafter"] == "none" and plan.steering["v_layers"] == [1, 2, 3]


def test_an_override_that_conflicts_with_the_checkpoint_is_an_error_and_the_record_shows_what_ran(tmp_path):
    checkpoint = _sd2_checkpoint(tmp_path)
    base = [*TINY, "method=sd2", "steering=sd2", f"steering.checkpoint={checkpoint}", "tracking=none"]
    proc = launch([*base, "steering.v_layers=[3,15,99]", f"hydra.run.dir={tmp_path / 'bad'}"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "steering.v_layers=[3, 15, 99] conflicts with steering.checkpoint=" in proc.stderr
    assert "trained with steering.v_layers=[1, 2, 3]" in proc.stderr
    # Not overridden: the run records the checkpoint's values (the fake weights then fail to load).
    launch([*base, f"hydra.run.dir={tmp_path / 'good'}"])
    recorded = OmegaConf.load(tmp_path / "good" / ".hydra" / "config.yaml")
    assert recorded.steering.v_layers == [1, 2, 3] and recorded.steering.guide_method == "simple"


class _NotAllowedInWeightsOnly:
    pass


def test_reading_a_foreign_pickle_never_passes_on_torchs_unsafe_advice(tmp_path):
    import torch

    from specbench.models.checkpoints import read_checkpoint, read_checkpoint_metadata

    path = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}, "specbench": {"method": "sd2"}, "extra": _NotAllowedInWeightsOnly()}, path)
    assert read_checkpoint_metadata(path) == {"method": "sd2"}  # the metadata alone reads without torch
    with pytest.raises(ValueError) as info:
        read_checkpoint(path)
    assert "is not a specbench checkpoint" in str(info.value) and "weights_only" not in str(info.value)


@pytest.mark.parametrize("method", ["lossy", "static_ensemble", "cascade", "typical", "fly", "block"])
def test_a_rule_built_in_python_with_no_parameters_is_the_methods_config_default(method):
    """conf/method/<name>.yaml and the rule's constructor agree, so `build_rule(name)` runs `method=name`."""
    from specbench.decoding.methods import build_rule

    from_config = validate(compose_config([*TINY, f"method={method}"])).rule
    from_python = build_rule(method)
    assert type(from_config) is type(from_python)
    assert vars(from_config) == vars(from_python)


def test_cost_aware_drafts_at_most_schedule_gamma_which_follows_the_drafter_preset():
    from omegaconf import OmegaConf

    def schedule(*overrides):
        cfg = compose_config(["schedule=cost_aware", *overrides])
        return OmegaConf.to_container(cfg.schedule, resolve=True)

    assert (schedule()["gamma"], schedule()["max_gamma"]) == (10, 10)  # the default drafter's default_gamma
    assert schedule("model/drafter=eagle3-smollm2")["max_gamma"] == 3
    assert schedule("schedule.gamma=5")["max_gamma"] == 5  # a sweep over schedule.gamma sweeps the cap
    assert schedule("schedule.max_gamma=16")["max_gamma"] == 16
