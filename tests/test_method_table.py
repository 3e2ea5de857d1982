"""The method table (specbench/method_names.py) is read from conf/method/*.yaml and the rule classes'
``params`` declarations (specbench/method_params.py): the rule classes, the yaml defaults, the config schema,
the checks and both tables' labels must agree with it, and reading a declaration imports no class."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT
from omegaconf import OmegaConf

from specbench.config.schema import MethodConfig
from specbench.decoding.methods import RULES, build_rule
from specbench.method_names import (
    METHOD_ALIASES,
    METHOD_PARAMS,
    METHOD_TABLE,
    RULE_METHODS,
    all_params,
    check_rule_params,
    read_table,
    table_labels,
    unread_param_error,
)
from specbench.method_params import DeclarationError, Param, read_declaration
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
def test_every_rule_class_takes_exactly_the_parameters_it_declares(method):
    cls = RULES[method]
    assert own_parameters(cls) == set(METHOD_PARAMS[method]), (
        f"{cls.__name__}.__init__ takes {sorted(own_parameters(cls))}, its params declaration lists "
        f"{sorted(METHOD_PARAMS[method])}: declare each constructor parameter (and only those) as a Param"
    )


def test_a_rule_whose_parameter_is_missing_from_its_declaration_is_caught():
    class WiderRule(RULES["lossy"]):
        def __init__(self, lenience: float = 0.5, temperature: float = 1.0):
            super().__init__(lenience)

    assert own_parameters(WiderRule) != {p.name for p in WiderRule.params}


@pytest.mark.parametrize("method", RULE_METHODS)
def test_the_parsed_declaration_is_the_imported_one(method):
    cls = RULES[method]
    assert read_declaration(METHOD_TABLE[method].rule) == (cls.params, cls.param_checks)
    assert (METHOD_TABLE[method].params, METHOD_TABLE[method].checks) == (cls.params, cls.param_checks)
    assert cls.name == method  # the rule's name in describe() is the method's


def test_a_parameter_shared_by_methods_is_declared_alike():
    declared: dict[str, Param] = {}
    for method, entry in METHOD_TABLE.items():
        for param in entry.params:
            assert declared.setdefault(param.name, param) == param, (method, param)


def test_the_yamls_give_the_methods_and_their_aliases():
    assert METHOD_ALIASES == {
        "sd_en": "diversed", "sd_lossy": "lossy", "sd_static": "static_ensemble", "spe_cas": "cascade",
        "static_en": "static_ensemble", "eagle3_opd": "eagle3", "dflash_opd": "dflash",
    }  # fmt: skip
    assert set(RULE_METHODS) == {"sd", "lossy", "static_ensemble", "cascade", "typical", "block", "fly"}
    assert METHOD_TABLE["lossy"].rule == "specbench.decoding.rules.LenientRule"


def test_building_the_table_imports_no_torch():
    code = "import specbench.method_names, sys; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


RULE_MODULE = """
    import torch  # never imported by the table
    from specbench.decoding.rules import VerificationRule
    from specbench.method_params import Param

    STYLES = ("soft", "hard")

    class ClippedRule(VerificationRule):
        name = "clipped"
        params = (
            Param("clip", float, gt=0.0, le=1.0, label="clip"),
            Param("style", str, choices=STYLES, label="style", quiet="soft"),
        )

        def __init__(self, clip: float = 0.5, style: str = "soft"):
            self.clip, self.style = clip, style
"""


def test_a_new_rule_is_its_module_and_its_yaml(tmp_path, monkeypatch):
    (tmp_path / "clipped_rules.py").write_text(textwrap.dedent(RULE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = tmp_path / "method"
    conf.mkdir()
    (conf / "clipped.yaml").write_text("name: clipped\n_target_: clipped_rules.ClippedRule\nclip: 0.5\n")
    (conf / "sd_clipped.yaml").write_text("defaults:\n  - clipped\n  - _self_\n\nalias: sd_clipped\n")
    table, aliases = read_table(conf)
    assert "clipped_rules" not in sys.modules
    assert aliases == {"sd_clipped": "clipped"}
    clip, style = table["clipped"].params
    assert (clip.expect, clip.label) == ("in (0, 1]", "clip")
    assert (style.expect, style.quiet) == ("one of ['soft', 'hard']", "soft")
    assert style.problem("medium") == "method.style must be one of ['soft', 'hard'], got 'medium'"


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ("params = (Param('clip', float, gt=LIMIT),)", "'LIMIT' is no literal"),
        ("params = (Param('clip', torch.float32),)", "the type of"),
        ("params = (Param('clip', float, below=1.0),)", "unexpected keyword argument 'below'"),
        ("params = [make_params()]", "is not a Param(...) call"),
        ("param_checks = ('nonesuch',)", "param_checks ['nonesuch'] are not in"),
    ],
)
def test_a_declaration_that_is_no_literal_names_its_file_and_class(
    tmp_path, monkeypatch, declaration, message
):
    module = f"bad_rules_{abs(hash(declaration))}"
    path = tmp_path / f"{module}.py"
    path.write_text(f"import os\nLIMIT = os.cpu_count()\n\n\nclass BadRule:\n    {declaration}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DeclarationError) as info:
        read_declaration(f"{module}.BadRule")
    assert str(info.value).startswith(f"{path}: class BadRule: ") and message in str(info.value)
    with pytest.raises(DeclarationError, match="no class 'Missing'"):
        read_declaration(f"{module}.Missing")


@pytest.mark.parametrize("method", list(METHOD_TABLE))
def test_each_yaml_sets_a_good_default_for_every_parameter_it_reads(method):
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "method" / f"{method}.yaml"))
    node = raw.get("method", raw) if isinstance(raw.get("method"), dict) else raw
    params = {k: v for k, v in node.items() if k not in ("name", "defaults", "_target_")}
    assert set(params) == set(METHOD_PARAMS[method]), (method, sorted(params))
    assert node.get("_target_") == METHOD_TABLE[method].rule
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
