"""``dataset.subset`` (all | train | heldout): a fixed split of a prompt set by a hash of the prompt id."""

from __future__ import annotations

import json

import pytest
from helpers import compose_config

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError, validate
from specbench.data.dataset_config import dataset_settings
from specbench.data.dataset_subsets import heldout_score, in_subset
from specbench.data.datasets import load_dataset_prompts

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random"]


def ids(settings: dict) -> list:
    return [p.id for p in load_dataset_prompts(settings)]


def test_train_and_heldout_partition_spec_bench():
    everything = ids({"name": "spec_bench"})
    train = ids({"name": "spec_bench", "subset": "train"})
    heldout = ids({"name": "spec_bench", "subset": "heldout"})
    assert len(everything) == 480
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(everything)
    assert [i for i in everything if i in set(train)] == train  # file order is kept
    assert 0.14 < len(heldout) / len(everything) < 0.26  # heldout_fraction 0.2
    assert ids({"name": "spec_bench", "subset": "heldout"}) == heldout  # stable across calls
    half = ids({"name": "spec_bench", "subset": "heldout", "heldout_fraction": 0.5})
    assert 0.4 < len(half) / 480 < 0.6 and set(heldout) <= set(half)  # a larger fraction grows the part


def test_limit_and_seed_apply_after_the_split():
    train = ids({"name": "spec_bench", "subset": "train"})
    heldout = set(ids({"name": "spec_bench", "subset": "heldout"}))
    first = ids({"name": "spec_bench", "subset": "train", "limit": 50})
    assert first == train[:50] and not set(first) & heldout
    seeded = ids({"name": "spec_bench", "subset": "train", "limit": 50, "seed": 3})
    assert len(seeded) == 50 and set(seeded) <= set(train) and seeded != first
    assert (
        ids({"name": "spec_bench", "subset": "heldout", "limit": 7})
        == [i for i in ids({"name": "spec_bench"}) if i in heldout][:7]
    )


def test_membership_depends_on_the_id_only(tmp_path):
    rows = [{"id": f"q{i}", "prompt": f"question {i}", "category": "ab"[i % 2]} for i in range(60)]
    forward, backward = tmp_path / "forward.jsonl", tmp_path / "backward.jsonl"
    forward.write_text("".join(json.dumps(r) + "\n" for r in rows))
    backward.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    for part in ("train", "heldout"):
        a = ids({"name": "jsonl", "path": str(forward), "subset": part})
        b = ids({"name": "jsonl", "path": str(backward), "subset": part})
        assert a == list(reversed(b)) and a
        expected = [r["id"] for r in rows if in_subset("jsonl", r["id"], part, 0.2)]
        assert a == expected
    # the general loader (parquet, categories) splits by the same rule (the key names the dataset)
    parquet = tmp_path / "rows.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert ids({"name": "parquet", "path": str(parquet), "subset": "heldout"}) == [
        r["id"] for r in rows if in_subset("parquet", r["id"], "heldout", 0.2)
    ]
    assert ids({"name": "jsonl", "path": str(forward), "subset": "heldout", "categories": ["a"]}) == [
        r["id"] for r in rows if r["category"] == "a" and in_subset("jsonl", r["id"], "heldout", 0.2)
    ]


def test_hub_rows_are_split_before_the_limit(tmp_path, monkeypatch):
    import datasets

    rows = [{"prompt_id": f"p{i}", "prompt": f"chat {i}", "messages": []} for i in range(40)]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    heldout = ids({"name": "ultrachat", "subset": "heldout"})
    assert heldout == [r["prompt_id"] for r in rows if heldout_score("ultrachat", r["prompt_id"]) < 0.2]
    assert ids({"name": "ultrachat", "subset": "heldout", "limit": 2}) == heldout[:2]
    local = tmp_path / "ultrachat.jsonl"
    local.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ids({"name": "ultrachat", "path": str(local), "subset": "heldout"}) == heldout


def test_demo_split_and_description():
    train = ids({"name": "demo", "subset": "train"})
    heldout = ids({"name": "demo", "subset": "heldout"})
    assert sorted(train + heldout) == sorted(ids({"name": "demo"})) and not set(train) & set(heldout)
    described = dataset_settings({"name": "demo", "subset": "heldout", "heldout_fraction": 0.3}).describe()
    assert described["dataset_subset"] == "heldout" and described["dataset_heldout_fraction"] == 0.3
    assert dataset_settings({"name": "demo"}).describe()["dataset_subset"] == "all"
    node = compose_config(["dataset.subset=train", "dataset.heldout_fraction=0.25"]).dataset
    settings = dataset_settings(node)
    assert (settings.subset, settings.heldout_fraction) == ("train", 0.25)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"subset": "test"}, "dataset.subset"),
        ({"subset": "train", "heldout_fraction": 0.0}, "dataset.heldout_fraction"),
        ({"heldout_fraction": 1.0}, "dataset.heldout_fraction"),
        ({"heldout_fraction": -0.1}, "dataset.heldout_fraction"),
    ],
)
def test_bad_subset_values_name_the_key(values, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        dataset_settings({"name": "demo", **values})
    overrides = [f"dataset.{k}={v}" for k, v in values.items()]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_config([*TINY, *overrides]))
