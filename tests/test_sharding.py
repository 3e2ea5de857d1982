"""Sharded verifiers and drafters (specbench.models.sharding): accelerate device_map placement (CPU + disk
offload, accelerate's hooks on the forward path) and transformers tensor parallel over 2 CPU processes
(gloo) decode exactly what the unsharded model decodes through SpeculativeEngine; bad placements fail
with messages that name the key; the cluster and 70B presets.

What a CPU cannot show: layers on two different GPUs (the cache adapter moves its row / slot indices to each
layer's device; on one device that is a no-op), and NCCL. See docs/scaling.md.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from helpers import ROOT, compose_config

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.decoding.engine import GenerationSettings
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.evaluation import build_engines
from specbench.models.loading import ModelSpec, load_verifier
from specbench.models.sharding import (
    Placement,
    PlacementError,
    adopt_slurm_tasks,
    describe_model_placement,
    is_tensor_parallel,
    world,
)
from specbench.models.tiny import byte_tokenizer, tiny_random_model
from specbench.pairs import load_drafter

PROMPTS = [b"Assistant: the cat sat on the mat, the cat", b"User: hi", b"User: list three primes: 2, 3,"]
LAYER_1_ON_DISK = {
    "model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
    "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk",
}  # fmt: skip


def _save(directory, seed: int, layers: int):
    directory.mkdir(parents=True, exist_ok=True)
    tiny_random_model("llama", seed=seed, num_layers=layers).save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A 2-layer verifier and a 1-layer drafter saved as checkpoints (device_map loads checkpoints)."""
    root = tmp_path_factory.mktemp("tiny-checkpoints")
    return _save(root / "verifier", seed=0, layers=2), _save(root / "drafter", seed=1, layers=1)


def _spec(path: str) -> ModelSpec:
    return ModelSpec(kind="local", name="tiny", path=path)


def _decode(verifier, drafter, temperature=0.0, eos=None, seed=3):
    """What eval runs: build_engines (shared vocabulary, EOS, pad) with exact SD, gamma = 3."""
    engine, _ = build_engines(
        verifier, drafter, VerificationRule(), DraftSchedule(gamma=3),
        GenerationSettings(max_new_tokens=16, temperature=temperature, seed=seed), baseline=False,
    )  # fmt: skip
    if eos is not None:
        engine.eos_token_ids = (eos,)
    prompts = [list(p) for p in PROMPTS]
    results = engine.generate(prompts)
    return [r.output_ids for r in results], engine


@pytest.fixture(scope="module")
def unsharded(checkpoints):
    verifier_dir, drafter_dir = checkpoints
    verifier = load_verifier(_spec(verifier_dir), "cpu", "float32")
    drafter = load_drafter(_spec(drafter_dir), verifier, "cpu", "float32")
    return verifier, drafter


def _early_eos(unsharded) -> int:
    """A token row 0 emits early: used as EOS, row 0 leaves the batch before the others (select_rows)."""
    outputs, _ = _decode(*unsharded)
    return outputs[0][3]


# --- Placement: plain-data checks
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_map": "everywhere"}, "model.verifier.device_map='everywhere'"),
        ({"device_map": {}}, "empty mapping"),
        ({"device_map": {"model.layers.0": "gpu7"}}, "unknown device 'gpu7'"),
        ({"device_map": {"model.layers.0": -1}}, "GPU index must be >= 0"),
        ({"device_map": {"lm_head": "disk"}}, "offload_folder"),
        ({"max_memory": {0: "70GiB"}}, "max_memory caps"),
        ({"offload_folder": "/tmp/x"}, "only used with model.verifier.device_map"),
        ({"tp_plan": "colwise"}, "runtime.tp_plan='colwise'"),
        ({"tp_plan": "auto", "device_map": "auto"}, "exclusive"),
    ],
)
def test_bad_placements_name_the_key(kwargs, message):
    with pytest.raises(PlacementError, match=message):
        Placement(**kwargs)


def test_placement_reads_spec_fields_and_builds_from_pretrained_kwargs(tmp_path):
    spec = ModelSpec(kind="hub", path="x")
    spec.device_map = {
        "model.embed_tokens": 0,
        "lm_head": "disk",
    }  # model.verifier once the schema has the keys
    spec.offload_folder = str(tmp_path)
    placement = Placement.of(spec, key="model.drafter")
    assert placement.sharded and placement.key == "model.drafter"
    assert placement.from_pretrained_kwargs() == {
        "device_map": {"model.embed_tokens": 0, "lm_head": "disk"}, "offload_folder": str(tmp_path),
    }  # fmt: skip
    plain = Placement.of(ModelSpec(kind="hub", path="x"))
    assert not plain.sharded and plain.from_pretrained_kwargs() == {}


def test_tiny_random_cannot_be_sharded():
    with pytest.raises(ValueError, match="kind='tiny_random' has none"):
        load_verifier(ModelSpec(kind="tiny_random"), "cpu", "float32", placement=Placement(device_map="auto"))


def test_tensor_parallel_outside_torchrun_names_the_command(checkpoints, monkeypatch):
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(PlacementError, match="torchrun --nproc_per_node=N"):
        load_verifier(_spec(checkpoints[0]), "cpu", "float32", placement=Placement(tp_plan="auto"))


def test_slurm_tasks_become_torchrun_ranks():
    env = {
        "SLURM_NTASKS": "4",
        "SLURM_NNODES": "1",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "2",
        "SLURM_JOB_ID": "123",
    }
    assert adopt_slurm_tasks(env)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("2", "2", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "20123")
    assert not adopt_slurm_tasks(env)  # torchrun's variables are there now
    assert not adopt_slurm_tasks({"SLURM_NTASKS": "1"})
    with pytest.raises(PlacementError, match="torchrun"):
        adopt_slurm_tasks({"SLURM_NTASKS": "16", "SLURM_NNODES": "2"})


def test_world_reads_torchrun_then_slurm(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert world() == (3, 1, 4)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert world() == (0, 0, 2)


# --- device_map: accelerate's hooks on the decoding path
# -----------------------------------------------------


def test_device_map_with_disk_offload_decodes_like_the_unsharded_model(checkpoints, unsharded, tmp_path):
    eos = _early_eos(unsharded)
    placement = Placement(device_map=LAYER_1_ON_DISK, offload_folder=str(tmp_path / "offload"))
    verifier = load_verifier(_spec(checkpoints[0]), "cpu", "float32", placement=placement)
    layer = verifier.model.model.layers[1]
    assert layer.self_attn.q_proj.weight.device.type == "meta"  # the weights live on disk ...
    assert type(layer._hf_hook).__name__ == "AlignDevicesHook"  # ... and accelerate loads them per forward
    assert describe_model_placement(verifier.model)["devices"] == ["cpu", "disk"]
    drafter = load_drafter(_spec(checkpoints[1]), verifier, "cpu", "float32")
    expected = {t: _decode(*unsharded, temperature=t, eos=eos)[0] for t in (0.0, 1.0)}
    for temperature in (0.0, 1.0):
        assert _decode(verifier, drafter, temperature=temperature, eos=eos)[0] == expected[temperature]
    greedy = expected[0.0]
    assert len(greedy[0]) < 16 and greedy[0][-1] == eos  # row 0 left the batch early (select_rows)
    assert len(greedy[1]) == 16 and expected[1.0] != greedy  # the others ran on; sampling sampled


def test_device_map_auto_spills_to_disk_and_decodes_alike(checkpoints, unsharded, tmp_path):
    placement = Placement(
        device_map="auto", max_memory={"cpu": 450_000}, offload_folder=str(tmp_path / "off")
    )
    verifier = load_verifier(_spec(checkpoints[0]), "cpu", "float32", placement=placement)
    placed = verifier.model.hf_device_map
    assert placed["model.embed_tokens"] == "cpu" and "disk" in placed.values()
    drafter = load_drafter(_spec(checkpoints[1]), verifier, "cpu", "float32")
    assert _decode(verifier, drafter)[0] == _decode(*unsharded)[0]


def test_offloaded_embedding_is_refused_with_the_fix(checkpoints, tmp_path):
    placement = Placement(
        device_map="auto", max_memory={"cpu": 120_000}, offload_folder=str(tmp_path / "off")
    )
    with pytest.raises(PlacementError, match="keep the first modules on a GPU"):
        load_verifier(_spec(checkpoints[0]), "cpu", "float32", placement=placement)


def test_drafter_device_map_and_a_lookup_drafter(checkpoints, unsharded, tmp_path):
    eos = _early_eos(unsharded)
    verifier = load_verifier(
        _spec(checkpoints[0]), "cpu", "float32",
        placement=Placement(device_map=LAYER_1_ON_DISK, offload_folder=str(tmp_path / "v")),
    )  # fmt: skip
    drafter_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.norm": "cpu",
                   "model.rotary_emb": "cpu", "lm_head": "cpu"}  # fmt: skip
    drafter = load_drafter(
        _spec(checkpoints[1]), verifier, "cpu", "float32",
        placement=Placement(device_map=drafter_map, offload_folder=str(tmp_path / "d"), key="model.drafter"),
    )  # fmt: skip
    assert drafter.model.model.layers[0].mlp.up_proj.weight.device.type == "meta"
    assert _decode(verifier, drafter, eos=eos)[0] == _decode(*unsharded, eos=eos)[0]
    lookup = PromptLookupDrafter(max_matching_ngram_size=2, num_output_tokens=4)
    expected = _decode(unsharded[0], PromptLookupDrafter(max_matching_ngram_size=2, num_output_tokens=4))[0]
    assert _decode(verifier, lookup)[0] == expected


# --- tensor parallel: 2 CPU processes, gloo
# -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tp_rank(rank: int, world_size: int, port: int, verifier_dir: str, drafter_dir: str, eos: int, out: str):
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
    )  # fmt: skip
    torch.set_num_threads(1)
    verifier = load_verifier(_spec(verifier_dir), "cpu", "float32", placement=Placement(tp_plan="auto"))
    drafter = load_drafter(_spec(drafter_dir), verifier, "cpu", "float32")
    greedy, engine = _decode(verifier, drafter, eos=eos)
    sampled, _ = _decode(verifier, drafter, temperature=1.0, eos=eos)
    engine.verifier.reset(1)
    engine.verifier.forward(torch.tensor([list(PROMPTS[0])]))  # the cache adapter over this rank's shard
    record = {
        "greedy": greedy,
        "sampled": sampled,
        "tensor_parallel": is_tensor_parallel(verifier.model),
        "q_rows": verifier.model.model.layers[0].self_attn.q_proj.weight.to_local().shape[0],
        "cache_heads": engine.verifier.cache.layers[0].keys.shape[1],
        "placement": describe_model_placement(verifier.model),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_tensor_parallel_over_two_cpu_processes_decodes_like_the_unsharded_model(
    checkpoints, unsharded, tmp_path
):
    eos = _early_eos(unsharded)
    mp.spawn(
        _tp_rank, args=(2, _free_port(), *checkpoints, eos, str(tmp_path)), nprocs=2, join=True
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected, _ = _decode(*unsharded, eos=eos)
    for record in ranks:
        assert record["tensor_parallel"] and record["placement"]["tensor_parallel_size"] == 2
        assert record["q_rows"] == 32  # half of q_proj's 64 rows on each rank
        assert record["cache_heads"] == 1  # and one of the 2 KV heads in each rank's cache
        assert record["greedy"] == expected
    assert ranks[0]["sampled"] == ranks[1]["sampled"]  # every rank draws the same tokens


# --- presets
# ----------------------------------------------------------------------------------------------------

PRESETS_70B = {
    "llama3-70b-sd": "meta-llama/Llama-3.2-1B-Instruct",
    "llama3-70b-eagle3": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
}


@pytest.mark.parametrize(("name", "drafter"), sorted(PRESETS_70B.items()))
def test_70b_presets_say_how_to_run_and_place_the_verifier(name, drafter):
    text = (ROOT / "conf" / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n") and f"experiment={name}" in text
    assert "+cluster=slurm-gpu-4x" in text and "runtime.tp_plan=auto" in text
    cfg = compose_config([f"experiment={name}"])
    verifier = cfg.model.verifier
    assert verifier.path == "meta-llama/Llama-3.3-70B-Instruct" and cfg.runtime.dtype == "bfloat16"
    assert Placement(device_map=verifier.device_map).sharded
    drafter_path = cfg.model.drafter.get("path") or (cfg.model.drafter.get("params") or {}).get("path")
    assert drafter_path == drafter


@pytest.mark.parametrize(("name", "gpus", "tasks"), [
    ("slurm-gpu-4x", 4, 1), ("slurm-gpu-8x", 8, 1), ("slurm-gpu-tp4", 4, 4), ("slurm-gpu-tp8", 8, 8),
])  # fmt: skip
def test_cluster_variants_extend_slurm_gpu(name, gpus, tasks):
    cfg = compose_config([f"+cluster={name}"], return_hydra_config=True)
    base = compose_config(["+cluster=slurm-gpu"], return_hydra_config=True).hydra.launcher
    launcher = cfg.hydra.launcher
    assert (launcher.gpus_per_node, launcher.tasks_per_node) == (gpus, tasks)
    assert (launcher.partition, launcher.signal_delay_s, launcher.setup) == (
        base.partition,
        base.signal_delay_s,
        base.setup,
    )
    assert launcher._target_.endswith("SlurmLauncher")
