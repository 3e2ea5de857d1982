"""specbench.targets: what every configured thing is built by (Hydra's instantiate on a ``_target_``)."""

from __future__ import annotations

import pytest

from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.targets import build_target, check_target

NGRAM = "specbench.drafters.ngram.NgramDrafter"
PROMPT_LOOKUP = "specbench.drafters.prompt_lookup.PromptLookupDrafter"


class Needs:
    def __init__(self, size: int, verifier=None, vocab_size: int | None = None):
        self.size, self.verifier, self.vocab_size = size, verifier, vocab_size


class Plain:
    def __init__(self, size: int):
        self.size = size


def test_injected_objects_reach_only_targets_that_take_them():
    verifier = object()
    built = build_target(f"{__name__}.Needs", {"size": 3}, "model.drafter", verifier=verifier, vocab_size=7)
    assert built.size == 3 and built.verifier is verifier and built.vocab_size == 7  # the object itself
    plain = build_target(f"{__name__}.Plain", {"size": 2}, "model.drafter", verifier=verifier, vocab_size=7)
    assert plain.size == 2


def test_an_argument_the_target_lacks_names_the_key_and_what_it_takes():
    with pytest.raises(ValueError, match=r"model.drafter.params: .*NgramDrafter takes no parameter 'span'"):
        build_target(NGRAM, {"span": 2}, "model.drafter", "model.drafter.params")
    with pytest.raises(ValueError, match="takes no parameter 'verifier'"):  # injected names are not config
        check_target(f"{__name__}.Needs", {"size": 1, "verifier": 1}, "model.drafter", ("verifier",))


def test_a_target_that_does_not_import_names_the_key():
    with pytest.raises(ValueError, match=r"schedule._target_='nowhere.Thing': cannot import 'nowhere'"):
        build_target("nowhere.Thing", {}, "schedule")
    with pytest.raises(ValueError, match="must be a dotted path"):
        build_target("Thing", {}, "method")


def test_the_targets_own_errors_come_through_unwrapped():
    with pytest.raises(ValueError, match="num_output_tokens") as caught:
        build_target(PROMPT_LOOKUP, {"num_output_tokens": 0}, "model.drafter")
    assert "Error in call to target" not in str(caught.value)  # Hydra's wrapper taken off


def test_a_nested_target_is_built_and_containers_arrive_as_plain_python():
    built = build_target(
        f"{__name__}.Plain", {"size": {"_target_": NGRAM, "prompt_lookup_max": 3}}, "model.drafter"
    )
    assert isinstance(built.size, NgramDrafter)
    listed = build_target(f"{__name__}.Plain", {"size": {"a": [1, 2]}}, "x")
    assert type(listed.size) is dict and type(listed.size["a"]) is list
    assert isinstance(build_target(PROMPT_LOOKUP, {}, "x"), PromptLookupDrafter)
