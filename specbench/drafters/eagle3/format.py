"""EAGLE-3 heads on disk: public checkpoints in the EAGLE / SpecForge layout (export and load), and the
factory a ``model/drafter`` yaml names for any head (specbench's own checkpoints: :mod:`.checkpoint`).

The EAGLE / SpecForge layout (what vLLM's ``llama_eagle3.py`` / ``qwen3_eagle3.py`` and SGLang load) is a
directory with ``config.json`` — the verifier architecture's config with ``num_hidden_layers: 1``,
``draft_vocab_size`` and ``architectures: ["LlamaForCausalLMEagle3"]`` (``["Eagle3Qwen3ForCausalLM"]`` for
a Qwen3 layer) — and ``model.safetensors`` (or ``pytorch_model.bin``) with ``fc.weight`` (3H_V → H),
``midlayer.self_attn.{q,k,v}_proj.weight`` (2H inputs), ``midlayer.self_attn.o_proj.weight``,
``midlayer.mlp.{gate,up,down}_proj.weight``, ``midlayer.{input_layernorm,hidden_norm,
post_attention_layernorm}.weight``, ``norm.weight``, ``lm_head.weight`` (draft vocab × H), ``d2t``
(int64 offsets) and ``t2d`` (bool over the verifier vocabulary); ``embed_tokens.weight`` is optional
(absent: the verifier's embedding is shared, as vLLM does).
:class:`~specbench.drafters.eagle3.head.Eagle3Head` uses these names, so the mapping is 1:1 (``layers.0.`` is
read as ``midlayer.``).

Taps: a checkpoint may name its verifier layers in ``eagle_config.eagle_aux_hidden_state_layer_ids``.
vLLM reads those as layer *inputs* (our taps); SGLang adds 1 (layer outputs). Exports therefore omit the
key for the default taps ``(2, N//2, N-3)`` (both engines' default) and write it in vLLM's sense
otherwise, next to ``specbench.taps``; when loading, ``taps=`` wins, then ``specbench.taps``, then the
key, then the default.

``python -m specbench.drafters.eagle3 export ...`` writes a specbench-trained head in this layout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specbench.drafters.eagle3.checkpoint import compact_checkpoint, load_trained_eagle3
from specbench.drafters.eagle3.drafter import Eagle3Drafter
from specbench.drafters.eagle3.head import Eagle3Head, default_taps, resolve_taps
from specbench.models.checkpoints import resolve_project_path
from specbench.models.draft_vocab import DraftVocab

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURES = {"llama": "LlamaForCausalLMEagle3", "qwen3": "Eagle3Qwen3ForCausalLM"}
KNOWN_ARCHITECTURES = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM"}
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
MAPPING_KEYS = ("d2t", "t2d")
EMBEDDING_KEY = "embed_tokens.weight"


class Eagle3FormatError(ValueError):
    """A checkpoint that is not an EAGLE-3 head, or one that does not fit the verifier."""


# --- export ---------------------------------------------------------------------------------------------


def export_eagle3(
    head: Eagle3Head,
    out_dir: str | Path,
    include_embedding: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    extra: dict | None = None,
) -> Path:
    """Write ``head`` to ``out_dir`` in the EAGLE / SpecForge layout (see the module docstring)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    model_type = head.config.model_type
    verifier_vocab = max(int(config.get("vocab_size") or 0), head.vocab.vocab_size)
    config.update(
        architectures=[ARCHITECTURES.get(model_type, ARCHITECTURES["llama"])],
        num_hidden_layers=1,
        vocab_size=verifier_vocab,
        draft_vocab_size=head.vocab.size,
        tie_word_embeddings=False,
        dtype=str(dtype).removeprefix("torch."),
        torch_dtype=str(dtype).removeprefix("torch."),  # the key older loaders read
    )
    config.pop("layer_types", None)
    config.pop("_attn_implementation_autoset", None)
    if head.verifier_hidden != head.hidden_size:
        config["target_hidden_size"] = head.verifier_hidden
    if head.norm_before_residual:
        config["norm_before_residual"] = True
    verifier_layers = head.verifier_layers
    eagle_config = {"use_aux_hidden_state": True}
    if verifier_layers is None or tuple(head.taps) != default_taps(int(verifier_layers)):
        eagle_config["eagle_aux_hidden_state_layer_ids"] = list(head.taps)
    config["eagle_config"] = eagle_config
    config["specbench"] = {"taps": list(head.taps), **(extra or {})}
    state = {
        name: tensor.detach().to("cpu", dtype).contiguous()
        for name, tensor in head.state_dict().items()
        if not name.startswith("embed_tokens.")
    }
    if include_embedding:
        state[EMBEDDING_KEY] = head.embedding.weight.detach().to("cpu", dtype).contiguous()
    t2d = torch.zeros(verifier_vocab, dtype=torch.bool)
    t2d[: head.vocab.vocab_size] = head.vocab.t2d
    state["d2t"], state["t2d"] = head.vocab.d2t.contiguous(), t2d
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")
    return out_dir


# --- loading the public layout --------------------------------------------------------------------------


def _local_dir(source: str | Path) -> Path:
    path = Path(str(source)).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(source).startswith((".", "/", "~")):
        raise FileNotFoundError(f"EAGLE-3 checkpoint {str(source)!r} is not a directory with {CONFIG_FILE}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(source), allow_patterns=["*.json", "*.safetensors", "*.bin"]))
    except Exception as err:  # offline, unknown repo, no access
        raise FileNotFoundError(
            f"cannot fetch the EAGLE-3 checkpoint {str(source)!r} from the hub "
            f"({type(err).__name__}: {err}); "
            "download it and pass the local directory"
        ) from err


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    safetensors = sorted(directory.glob("*.safetensors"))
    if safetensors:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for path in safetensors:
            state.update(load_file(str(path)))
        return state
    bins = sorted(directory.glob("*.bin"))
    if not bins:
        raise Eagle3FormatError(f"{directory} has no model.safetensors or pytorch_model.bin")
    state = {}
    for path in bins:
        state.update(torch.load(path, map_location="cpu", weights_only=True))
    return state


def read_eagle3_config(directory: Path) -> dict:
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise Eagle3FormatError(f"{directory / CONFIG_FILE}: unreadable ({err})") from err
    architectures = set(config.get("architectures") or [])
    if not architectures & KNOWN_ARCHITECTURES and "draft_vocab_size" not in config:
        raise Eagle3FormatError(
            f"{directory} is not an EAGLE-3 head (architectures {sorted(architectures)}, no draft_vocab_size)"
        )
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise Eagle3FormatError(
            f"{directory}: {config['num_hidden_layers']}-layer EAGLE-3 heads are not supported (1 layer)"
        )
    eagle_config = config.get("eagle_config") or {}
    if eagle_config.get("use_aux_hidden_state") is False:
        raise Eagle3FormatError(
            f"{directory}: a head without aux hidden states (EAGLE-1/2 style) is not EAGLE-3"
        )
    used = [flag for flag in UNSUPPORTED_FLAGS if config.get(flag) or eagle_config.get(flag)]
    if used:
        raise Eagle3FormatError(f"{directory}: EAGLE-3 variants with {used} are not supported")
    return config


def checkpoint_taps(config: dict, num_layers: int, taps=None) -> tuple[int, ...]:
    """The verifier taps a checkpoint reads (see the module docstring for the precedence)."""
    if taps is None:
        taps = (config.get("specbench") or {}).get("taps")
    if taps is None:
        eagle_config = config.get("eagle_config") or {}
        taps = config.get("eagle_aux_hidden_state_layer_ids") or eagle_config.get(
            "eagle_aux_hidden_state_layer_ids"
        )
    return resolve_taps(taps, num_layers)


def load_eagle3_pretrained(source: str | Path, verifier: Any, vocab_size: int, taps=None) -> Eagle3Head:
    """An :class:`Eagle3Head` from a public checkpoint (local dir or hub id) for ``verifier`` (a LoadedModel);
    ``vocab_size`` is the vocabulary the engine compares p and q over."""
    directory = _local_dir(source)
    config = read_eagle3_config(directory)
    model = verifier.model
    verifier_hidden = int(model.config.hidden_size)
    model_type = config.get("model_type", "llama")
    if model_type not in CONFIG_MAPPING:
        raise Eagle3FormatError(f"{directory}: unknown model_type {model_type!r}")
    layer_config = CONFIG_MAPPING[model_type](**{k: v for k, v in config.items() if k != "model_type"})
    target_hidden = int(config.get("target_hidden_size") or config["hidden_size"])
    if target_hidden != verifier_hidden:
        raise Eagle3FormatError(
            f"{directory} was trained on a verifier of hidden size {target_hidden}; model/verifier has "
            f"{verifier_hidden}"
        )
    state = {
        k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v
        for k, v in _read_weights(directory).items()
    }
    state = {k.removeprefix("model."): v for k, v in state.items()}
    vocab = _mapping(state, config, vocab_size, directory)
    embedding, own = model.get_input_embeddings(), False
    if EMBEDDING_KEY in state:
        weights = state.pop(EMBEDDING_KEY)
        if not _same_rows(weights, embedding.weight):
            embedding, own = torch.nn.Embedding(*weights.shape, _weight=weights.float().clone()), True
    if not own and int(config["hidden_size"]) != embedding.embedding_dim:
        raise Eagle3FormatError(
            f"{directory}: head width {config['hidden_size']} needs its own embed_tokens.weight"
        )
    head = Eagle3Head(
        layer_config,
        checkpoint_taps(config, int(model.config.num_hidden_layers), taps),
        vocab,
        embedding,
        verifier_hidden=target_hidden,
        own_embedding=own,
        norm_before_residual=bool(config.get("norm_before_residual")),
    )
    head.verifier_layers = int(model.config.num_hidden_layers)
    expected = set(head.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise Eagle3FormatError(
            f"{directory} does not fit an EAGLE-3 head of this layout: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    head.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True
    )
    param = next(model.parameters())
    return head.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)


def _same_rows(weights: torch.Tensor, shared: torch.Tensor, rows: int = 257) -> bool:
    """Whether a checkpoint's embedding is the verifier's (up to bf16), judged on evenly spaced rows (a
    full comparison would copy a multi-GB matrix to the CPU)."""
    if weights.shape != shared.shape:
        return False
    picked = torch.linspace(0, shared.shape[0] - 1, min(rows, shared.shape[0])).long()
    mine = weights[picked].float()
    theirs = shared.detach()[picked.to(shared.device)].float().cpu()
    return torch.allclose(mine, theirs, atol=1e-2, rtol=1e-2)


def _mapping(state: dict, config: dict, vocab_size: int, directory: Path) -> DraftVocab:
    draft_size = int(config.get("draft_vocab_size") or config.get("vocab_size"))
    checkpoint_vocab = int(config.get("vocab_size") or vocab_size)
    d2t = state.pop("d2t", None)
    t2d = state.pop("t2d", None)
    if d2t is None:
        d2t = torch.zeros(draft_size, dtype=torch.long)
    if d2t.numel() != draft_size:
        raise Eagle3FormatError(
            f"{directory}: d2t has {d2t.numel()} entries, draft_vocab_size is {draft_size}"
        )
    target_ids = torch.arange(draft_size) + d2t.long()
    if int(target_ids.max()) >= vocab_size:
        raise Eagle3FormatError(
            f"{directory}: the draft vocabulary reaches target id {int(target_ids.max())}, beyond the "
            "verifier's "
            f"vocabulary of {vocab_size}; this head was made for another tokenizer"
        )
    if t2d is not None:
        t2d = t2d.bool().flatten()
        if t2d.numel() != checkpoint_vocab or bool(t2d[vocab_size:].any()):
            raise Eagle3FormatError(f"{directory}: t2d does not cover the vocabulary of {checkpoint_vocab}")
        t2d = t2d[:vocab_size]
    try:
        return DraftVocab.from_mappings(d2t, vocab_size, t2d)
    except ValueError as err:
        raise Eagle3FormatError(f"{directory}: {err}") from err


# --- specbench checkpoints ------------------------------------------------------------------------------


def load_eagle3_drafter(
    source: str | Path,
    verifier: Any,
    vocab_size: int,
    taps=None,
    name: str | None = None,
    tree_width: int = 1,
) -> Eagle3Drafter:
    """An :class:`Eagle3Drafter` from a specbench checkpoint file, or a public head (directory / hub id);
    ``tree_width`` > 1 drafts trees (the chain plus ``tree_width − 1`` leaves per depth)."""
    path = Path(str(source)).expanduser()
    if path.is_file():
        head, metadata = load_trained_eagle3(path, verifier, vocab_size)
        if taps is not None and tuple(taps) != tuple(metadata["taps"]):
            raise ValueError(
                f"model.drafter.params.taps={list(taps)} but {str(path)!r} was trained on taps "
                f"{metadata['taps']}"
            )
    else:
        head = load_eagle3_pretrained(source, verifier, vocab_size, taps)
    return Eagle3Drafter(head, name or f"eagle3 ({Path(str(source)).name})", tree_width=tree_width)


CHECKPOINT_SUFFIXES = (".pt", ".ckpt", ".safetensors")
resolve_head_path = resolve_project_path  # the committed heads under checkpoints/ load from anywhere


def looks_like_file(path: str) -> bool:
    """Whether ``path`` names a local checkpoint file rather than a hub id or directory."""
    return str(path).endswith(CHECKPOINT_SUFFIXES) or str(path).startswith(("/", "./", "../", "~"))


def eagle3_drafter(
    path: str | None, verifier: Any, vocab_size: int, taps=None, tree_width: int = 1
) -> Eagle3Drafter:
    """``model/drafter=eagle3``: the head at ``path`` (``model.drafter.params.path``) for this verifier;
    ``tree_width`` (``model.drafter.params.tree_width``) > 1 drafts trees, verified by ``method=sd``."""
    if not path:
        raise ValueError(
            "model.drafter.params.path is null: pass the trained.pt of `task=train method=eagle3`, an "
            "EAGLE / SpecForge checkpoint directory or a hub id (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)"
        )
    return load_eagle3_drafter(resolve_head_path(path), verifier, vocab_size, taps, tree_width=tree_width)


# --- command line ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specbench.drafters.eagle3",
        description="Export a specbench-trained EAGLE-3 head (trained.pt) in the EAGLE / SpecForge layout.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="trained.pt -> a directory vLLM / SGLang EAGLE-3 loaders read")
    export.add_argument("checkpoint", help="trained.pt (or last.ckpt) of task=train method=eagle3")
    export.add_argument("out_dir")
    export.add_argument(
        "--verifier",
        default="embedded",
        help="'embedded' (SmolLM2-135M-Instruct), a hub id or a local model directory",
    )
    export.add_argument("--with-embedding", action="store_true", help="also store embed_tokens.weight")
    export.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    compact = sub.add_parser("compact", help="trained.pt / last.ckpt -> a trained.pt with bf16 weights")
    compact.add_argument("checkpoint", help="trained.pt (or last.ckpt) of task=train method=eagle3")
    compact.add_argument("out", help="the file to write (e.g. checkpoints/NAME/trained.pt)")
    compact.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)
    if args.command == "compact":
        out = compact_checkpoint(args.checkpoint, args.out, getattr(torch, args.dtype))
        print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
        return 0
    from specbench.models.loading import ModelSpec, load_verifier

    if args.verifier == "embedded":
        spec = ModelSpec(kind="embedded")
    else:
        kind = "local" if Path(args.verifier).expanduser().is_dir() else "hub"
        spec = ModelSpec(kind=kind, name=args.verifier, path=args.verifier)
    verifier = load_verifier(spec, device="cpu", dtype="float32")
    head, metadata = load_trained_eagle3(args.checkpoint, verifier, len(verifier.tokenizer))
    extra = {key: metadata.get(key) for key in ("verifier", "draft_vocab_fingerprint")}
    out = export_eagle3(head, args.out_dir, args.with_embedding, getattr(torch, args.dtype), extra)
    print(f"wrote {out / CONFIG_FILE} and {out / WEIGHTS_FILE}")
    return 0
