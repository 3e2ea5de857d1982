"""Models that do not fit one device: accelerate ``device_map`` placement and transformers tensor parallel.

Two ways past one GPU, both handed to the libraries that own them:

- ``device_map`` (accelerate big-model inference, through ``from_pretrained(device_map=...)``): the layers
  are spread over the GPUs in order (``auto`` / ``balanced`` / ``balanced_low_0`` / ``sequential`` or an
  explicit ``{module: device}`` dict), optionally spilling to CPU RAM or disk (``offload_folder``). One
  process; each forward walks the layers device by device. accelerate's hooks move activations between
  devices; the engine's KV cache keeps each layer's keys and values on that layer's device.
- ``tp_plan="auto"`` (transformers tensor parallel, ``DistributedConfig(tp_plan="auto")``): under
  ``torchrun --nproc_per_node=N`` every rank holds 1/N of every weight matrix (DTensor) and of every
  layer's KV heads; all ranks run the same decoding loop on the same (all-gathered) logits, so they draw
  the same tokens. Only the main process (rank 0) should write results (:func:`is_main_process`).

The engine feeds inputs on the device of the model's first parameter (the embedding) and reads the logits
there (accelerate's top-level hook brings outputs back to the inputs' device), so the embedding must not
be offloaded: :func:`check_placement` refuses such a model with a message that names the fix.

:class:`Placement` is plain data (no torch import), so configs can be checked before torch loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
TP_PLANS = ("auto",)
# ModelSpec fields that say where a model's weights go (not what the model is).
PLACEMENT_FIELDS = ("device_map", "max_memory", "offload_folder")
_DEVICE_WORDS = ("cpu", "disk", "cuda", "mps", "xpu")


class PlacementError(ValueError):
    """A device_map / tp_plan that cannot work; the message names the config key and the fix."""


def _check_device_name(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PlacementError(f"{where}: a device is a GPU index, 'cpu', 'disk' or 'cuda:N', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise PlacementError(f"{where}: GPU index must be >= 0, got {value}")
        return
    word, _, index = value.partition(":")
    if word not in _DEVICE_WORDS or (index and not index.isdigit()) or (index and word in ("cpu", "disk")):
        raise PlacementError(f"{where}: unknown device {value!r}; use a GPU index, 'cpu', 'disk' or 'cuda:N'")


@dataclass(frozen=True)
class Placement:
    """Where a model's weights go. The default (all None) is one device, as ``runtime.device`` says.

    ``device_map``: an accelerate strategy (``auto``, ``balanced``, ``balanced_low_0``, ``sequential``) or a
    ``{module name: device}`` dict (GPU index, ``cpu``, ``disk``, ``cuda:N``); ``max_memory``:
    ``{device: "70GiB"}`` caps for the strategies; ``offload_folder``: where ``disk`` modules are written;
    ``tp_plan``: ``"auto"`` for transformers tensor parallel under torchrun (the verifier only).
    """

    device_map: str | dict[str, int | str] | None = None
    max_memory: dict[int | str, int | str] | None = None
    offload_folder: str | None = None
    tp_plan: str | None = None
    key: str = "model.verifier"  # the config node, for error messages

    def __post_init__(self) -> None:
        key = self.key
        if isinstance(self.device_map, str):
            if self.device_map not in DEVICE_MAP_STRATEGIES:
                raise PlacementError(
                    f"{key}.device_map={self.device_map!r}: expected one of {list(DEVICE_MAP_STRATEGIES)} "
                    "or a {module: device} mapping"
                )
        elif isinstance(self.device_map, dict):
            if not self.device_map:
                raise PlacementError(f"{key}.device_map: an empty mapping places nothing; use null or 'auto'")
            for module, device in self.device_map.items():
                if not isinstance(module, str):
                    raise PlacementError(f"{key}.device_map: module names are strings, got {module!r}")
                _check_device_name(device, f"{key}.device_map[{module!r}]")
            if "disk" in self.device_map.values() and not self.offload_folder:
                raise PlacementError(
                    f"{key}.device_map puts modules on 'disk': set {key}.offload_folder to a local directory"
                )
        elif self.device_map is not None:
            raise PlacementError(
                f"{key}.device_map must be a strategy name or a mapping, got {self.device_map!r}"
            )
        if self.max_memory is not None:
            if not isinstance(self.device_map, str):
                raise PlacementError(
                    f"{key}.max_memory caps accelerate's placement strategies: set {key}.device_map=auto "
                    "(or balanced / sequential) with it"
                )
            if not isinstance(self.max_memory, dict) or not self.max_memory:
                raise PlacementError(f"{key}.max_memory must be a mapping like {{0: '70GiB', cpu: '200GiB'}}")
            for device in self.max_memory:
                _check_device_name(device, f"{key}.max_memory")
        if self.offload_folder is not None and self.device_map is None:
            raise PlacementError(f"{key}.offload_folder is only used with {key}.device_map")
        if self.tp_plan is not None:
            if self.tp_plan not in TP_PLANS:
                raise PlacementError(
                    f"runtime.tp_plan={self.tp_plan!r}: expected null or one of {list(TP_PLANS)}"
                )
            if self.device_map is not None:
                raise PlacementError(
                    f"runtime.tp_plan={self.tp_plan!r} and {key}.device_map are exclusive: tensor parallel "
                    "puts a "
                    f"slice of every layer on every rank; set {key}.device_map=null"
                )

    @property
    def sharded(self) -> bool:
        """Whether the libraries place the weights (else the loader moves the model to one device)."""
        return self.device_map is not None or self.tp_plan is not None

    @classmethod
    def of(cls, spec: Any, tp_plan: str | None = None, key: str = "model.verifier") -> Placement:
        """The placement a model spec asks for (its ``device_map`` / ``max_memory`` / ``offload_folder``
        fields, absent on specs that have none) plus ``runtime.tp_plan``."""
        values = {name: _plain(getattr(spec, name, None)) for name in PLACEMENT_FIELDS}
        return cls(**values, tp_plan=tp_plan, key=key)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AutoModelForCausalLM.from_pretrained`` (empty when not sharded)."""
        kwargs: dict[str, Any] = {}
        if self.tp_plan is not None:
            from transformers.distributed import DistributedConfig

            adopt_slurm_tasks()
            check_distributed(self.tp_plan)
            kwargs["distributed_config"] = DistributedConfig(tp_plan=self.tp_plan)
        if self.device_map is not None:
            kwargs["device_map"] = self.device_map
            if self.max_memory is not None:
                kwargs["max_memory"] = self.max_memory
            if self.offload_folder is not None:
                kwargs["offload_folder"] = self.offload_folder
        return kwargs

    def describe(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "key"}


def _plain(value: Any) -> Any:
    """OmegaConf containers (DictConfig) as plain dicts; other values as they are."""
    if value is not None and hasattr(value, "items") and not isinstance(value, dict):
        return {k: v for k, v in value.items()}
    return value


# --- processes --------------------------------------------------------------------------------------------


def world() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's variables, else SLURM's (one task per GPU, e.g.
    ``+cluster=slurm-gpu-tp8``); (0, 0, 1) for a process that runs alone."""
    env = os.environ
    return (
        int(env.get("RANK", env.get("SLURM_PROCID", "0"))),
        int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))),
        int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1"))),
    )


def adopt_slurm_tasks(environ: dict[str, str] | None = None) -> bool:
    """Give the tasks of a one-node SLURM job torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), which transformers' tensor parallel reads; True if it set them.

    Nothing changes when torchrun's variables are there or the job has one task. Several nodes need a
    rendezvous address SLURM does not give a task: start those with torchrun.
    """
    env = os.environ if environ is None else environ
    tasks = int(env.get("SLURM_NTASKS", "1"))
    if "WORLD_SIZE" in env or tasks < 2:
        return False
    if int(env.get("SLURM_NNODES", "1")) != 1:
        raise PlacementError(
            f"runtime.tp_plan over {env.get('SLURM_NNODES')} nodes: start the job with torchrun "
            "(--nnodes, --rdzv-endpoint) instead of one SLURM task per GPU"
        )
    env["RANK"] = env.get("SLURM_PROCID", "0")
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["WORLD_SIZE"] = str(tasks)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    return True


def is_main_process() -> bool:
    """True on rank 0 (and outside torchrun): the process that writes samples, rows and run records."""
    return world()[0] == 0


def check_distributed(tp_plan: str | None) -> None:
    """Tensor parallel needs several processes started by torchrun; raise PlacementError otherwise."""
    if tp_plan is None:
        return
    if world()[2] < 2:
        raise PlacementError(
            f"runtime.tp_plan={tp_plan!r} splits the verifier over the processes of a torchrun job, but this "
            "process runs alone (WORLD_SIZE unset or 1): start it as `torchrun --nproc_per_node=N launch.py "
            "...`"
        )


def execution_device(requested: str | torch.device, placement: Placement) -> torch.device:
    """The device the engine runs on. Under tensor parallel: this rank's GPU (``cuda:LOCAL_RANK``) when
    ``runtime.device`` is auto / cuda, else cpu (gloo); otherwise ``runtime.device`` as it resolves."""
    import torch

    from specbench.models.devices import resolve_device

    device = resolve_device(requested)
    if placement.tp_plan is not None and device.type == "cuda":
        return torch.device("cuda", world()[1])
    return device


# --- loaded models ----------------------------------------------------------------------------------------


def input_device(model: PreTrainedModel) -> torch.device:
    """The device the engine's cache adapter feeds inputs on: the model's first parameter's device."""
    return next(model.parameters()).device


def is_tensor_parallel(model: PreTrainedModel) -> bool:
    """Whether the weights are DTensor shards (transformers tensor parallel)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def check_placement(model: PreTrainedModel, role: str = "verifier") -> None:
    """Raise PlacementError if the engine cannot feed this model: its embedding was offloaded (its weights
    on the meta device), so there is no device to put the inputs on."""
    device = input_device(model)
    if device.type == "meta":
        placed = getattr(model, "hf_device_map", None) or {}
        first = next(iter(placed), "the embedding")
        raise PlacementError(
            f"model.{role}.device_map offloads {first!r} (on {placed.get(first, 'meta')!r}): the engine "
            "feeds "
            f"token ids on the embedding's device, so keep the first modules on a GPU (cpu on a machine "
            f"without one), e.g. model.{role}.device_map=auto with a larger max_memory for GPU 0"
        )


def check_same_input_device(verifier: PreTrainedModel, drafter: PreTrainedModel) -> None:
    """A model drafter gets the engine's tensors as they are: its inputs must live where the verifier's do."""
    if input_device(verifier) != input_device(drafter):
        raise PlacementError(
            f"the drafter takes inputs on {input_device(drafter)} but the verifier on "
            f"{input_device(verifier)}: "
            "put the drafter's first modules on the verifier's first device (model.drafter.device_map, "
            "or runtime.device)"
        )


def ready(model: PreTrainedModel, role: str = "verifier") -> PreTrainedModel:
    """A model the libraries placed: eval mode, frozen, checked (never moved: that would undo the
    placement)."""
    model.eval()
    model.requires_grad_(False)
    check_placement(model, role)
    return model


def describe_model_placement(model: PreTrainedModel) -> dict[str, Any]:
    """What a run record should say about where the model ran: device map, tensor-parallel world size."""
    info: dict[str, Any] = {"input_device": str(input_device(model))}
    placed = getattr(model, "hf_device_map", None)
    if placed:
        info["device_map"] = {k: str(v) for k, v in placed.items()}
        info["devices"] = sorted({str(v) for v in placed.values()})
    if is_tensor_parallel(model):
        info["tensor_parallel_size"] = world()[2]
    return info
