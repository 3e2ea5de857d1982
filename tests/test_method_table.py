"""The method table (specbench/method_names.py) is the one place a method's parameters are declared: the rule
classes, the yaml defaults, the config schema, the checks and both tables' labels must agree with it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from helpers import ROOT
from omegaconf import OmegaConf

from specbench.config.schema import MethodConfig
from specbench.decoding.methods import RULES, build_rule
from specbench.method_names import (
    METHOD_PARAMS,
    METHOD_TABLE,
    RULE_METHODS,
    all_params,
    check_rule_params,
    table_labels,
    unread_param_error,
)
from specbench.reporting.table import PARAM_LABELS
from specbench.tasks.results import LABEL_PARAMS, method_label


def own_parameters(cls: type) -> set[str]:
    """The constructor parameters a rule class declares (``*args/**kwargs`` of the base say nothing)."""
    return {
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


@pytest.mark.parametrize("method", RULE_METHODS)
def test_every_rule_class_takes_exactly_the_parameters_of_its_row(method):
    assert own_parameters(RULES[method]) == set(METHOD_PARAMS[method]), (
        f"{RULES[method].__name__} takes {sorted(own_parameters(RULES[method]))}, its row in METHOD_TABLE "
        f"declares {sorted(METHOD_PARAMS[method])}: add the missing Param to specbench/method_names.py"
    )


def test_a_rule_whose_parameter_is_missing_from_the_table_is_caught():
    class WiderRule(RULES["lossy"]):
        def __init__(self, lenience: float = 0.5, temperature: float = 1.0):
            super().__init__(lenience)

    assert own_parameters(WiderRule) != set(METHOD_PARAMS["lossy"])


@pytest.mark.parametrize("method", list(METHOD_TABLE))
def test_each_yaml_sets_a_good_default_for_every_parameter_it_reads(method):
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "method" / f"{method}.yaml"))
    node = raw.get("method", raw) if isinstance(raw.get("method"), dict) else raw
    params = {k: v for k, v in node.items() if k not in ("name", "defaults")}
    assert set(params) == set(METHOD_PARAMS[method]), (method, sorted(params))
    if method in RULE_METHODS:
        check_rule_params(method, params)
        rule = build_rule(method, **params)
        described = rule.describe()
        assert all(described[key] == value for key, value in params.items() if value is not None)


def test_the_schema_and_both_label_lists_are_the_tables():
    fields = {f.name for f in dataclasses.fields(MethodConfig)}
    assert {p.name for p in all_params()} <= fields
    labelled = {p.name for p in all_params() if p.label is not None}
    assert {key for key, _ in LABEL_PARAMS} == {p.name for p in all_params() if p.label and not p.is_path}
    assert {key for key, _ in PARAM_LABELS} == labelled - {"draft_weight"}  # the report's own w column
    assert {"window_size", "entropy_threshold", "entropy_top_k"} <= {key for key, _ in table_labels()}


def test_fly_parameters_show_in_the_results_label():
    metrics = {
        "method": "fly",
        "method_window_size": 4,
        "method_entropy_threshold": 0.5,
        "method_entropy_top_k": 3,
        "schedule": "constant",
        "gamma": 5,
    }
    assert method_label(metrics) == "fly window=4 entropy=0.5 top_k=3 (constant, gamma=5)"


@pytest.mark.parametrize(
    ("method", "values", "message"),
    [
        ("lossy", {"lenience": 0.0}, "method.lenience must be in (0, 1], got 0.0"),
        ("static_ensemble", {"draft_weight": "x", "pool": "linear"}, "method.draft_weight must be in [0, 1]"),
        ("static_ensemble", {"draft_weight": 0.2, "pool": "geo"}, "method.pool must be one of"),
        ("cascade", {"deferral": "token", "alpha": 2.0}, "in [0, 1] for the token deferral rule"),
        ("fly", {"window_size": True, "entropy_threshold": 0.3, "entropy_top_k": 3}, "method.window_size"),
        ("fly", {"window_size": None, "entropy_threshold": 0.3, "entropy_top_k": 0}, "method.entropy_top_k"),
    ],
)
def test_the_tables_checks_name_the_key(method, values, message):
    with pytest.raises(ValueError, match=None) as info:
        check_rule_params(method, values)
    assert message in str(info.value)


def test_the_unread_parameter_message_names_who_reads_it():
    assert unread_param_error("sd", "draft_weight") == (
        "method=sd does not read draft_weight; static_ensemble, sd_static and static_en do "
        "(add method=static_ensemble, or drop method.draft_weight)"
    )
    assert "cascade and spe_cas do" in unread_param_error("lossy", "alpha")
    assert "no parameter of any method" in unread_param_error("sd", "bogus")
