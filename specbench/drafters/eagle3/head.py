"""The EAGLE-3 draft head (SpecForge / vLLM conventions): its layers, one head step, the test-time-training
mask; :mod:`specbench.drafters.eagle3` puts it behind the drafter interface.

The head reads verifier hidden states at a few *taps* (anchors-2026.md §2; the tap convention of
``specbench/decoding/protocol.py``: ``taps[i]`` is the residual stream after ``i`` decoder layers, before the
final norm). Defaults are EAGLE-3's low / mid / high features, ``(2, N // 2, N - 3)`` for an ``N``-layer
verifier: SpecForge's ``hidden_states[1 + 1], [N // 2 - 1 + 1], [N - 4 + 1]`` (layer outputs 1, N/2 − 1,
N − 4) and vLLM's aux layers ``(2, N // 2, N - 3)`` (layer inputs) are the same tensors.

One head step at position ``t``::

    fused  = fc(concat(taps at t))            # 3H → H; on later draft steps: the head's own h_{t-1}
    x      = concat(input_layernorm(embed(token t+1)), hidden_norm(fused))      # width 2H
    h      = fused + attn(x);  h = h + mlp(post_attention_layernorm(h))        # one decoder layer
    logits = lm_head(norm(h))                 # over the draft vocabulary (draft_vocab.py)

The embedding is the verifier's (frozen, shared, not copied). The decoder layer is the verifier
architecture's own transformers class (``LlamaDecoderLayer``, ``Qwen3DecoderLayer``, …) with its q/k/v
projections widened to 2H; parameter names follow SpecForge (``fc``, ``midlayer.*``, ``norm``, ``lm_head``),
so :mod:`specbench.drafters.eagle3.format` maps them 1:1 to the EAGLE / SpecForge / vLLM layout.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specbench.models.draft_vocab import DraftVocab

WIDENED = ("q_proj", "k_proj", "v_proj")


def default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / mid / high taps for an ``num_layers``-layer verifier: ``(2, N // 2, N - 3)``."""
    return (2, num_layers // 2, num_layers - 3)


def resolve_taps(taps, num_layers: int, key: str = "model.drafter.params.taps") -> tuple[int, ...]:
    """``taps`` (None: the EAGLE-3 defaults) checked against the verifier depth: each in ``[0, N]``;
    errors name the config ``key`` they came from."""
    if taps is None:
        if num_layers < 3:
            raise ValueError(
                f"EAGLE-3's default taps (2, N//2, N-3) need a verifier with >= 3 layers, it has "
                f"{num_layers}; set {key} to a list of layer indices in [0, N]"
            )
        return default_taps(num_layers)
    taps = tuple(int(t) for t in taps)
    if not taps:
        raise ValueError(
            f"{key} is empty; give at least one verifier layer index (or null for the default)"
        )
    bad = [t for t in taps if not 0 <= t <= num_layers]
    if bad:
        raise ValueError(
            f"{key}={list(taps)}: {bad} outside [0, {num_layers}] for a {num_layers}-layer verifier "
            "(tap i = the residual stream after i decoder layers)"
        )
    return taps


def decoder_classes(model_type: str) -> tuple[type, type, type]:
    """(decoder layer, rotary embedding, RMSNorm) classes of a transformers architecture (``llama``, …)."""
    try:
        prefix = CONFIG_MAPPING[model_type].__name__.removesuffix("Config")
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        return (
            getattr(module, f"{prefix}DecoderLayer"),
            getattr(module, f"{prefix}RotaryEmbedding"),
            getattr(module, f"{prefix}RMSNorm"),
        )
    except (KeyError, ImportError, AttributeError) as err:
        raise ValueError(
            f"an EAGLE-3 head needs a decoder-only transformers architecture with <Name>DecoderLayer, "
            f"<Name>RotaryEmbedding and <Name>RMSNorm (llama, qwen3, qwen2, mistral, ...); "
            f"{model_type!r} has none"
        ) from err


def head_layer_config(base: PretrainedConfig) -> PretrainedConfig:
    """The config of the head's single decoder layer: ``base`` (the verifier's, or a checkpoint's) with one
    full-attention layer and SDPA attention."""
    config = copy.deepcopy(base)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"]
    config._attn_implementation = "sdpa"  # the training-time-test mask is boolean
    config.use_cache = True
    return config


@dataclass
class Eagle3Output:
    """``logits`` (B, W, draft vocab); ``hidden_states`` = (fused input, pre-norm output) when requested."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


class _StepCache:
    """The K/V of training-time-test steps: each step's keys are appended, attention sees all of them."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int = 0, *args, **kwargs):
        self.keys.append(key)
        self.values.append(value)
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)


def ttt_mask(valid: torch.Tensor, queries: torch.Tensor, step: int) -> torch.Tensor:
    """(B, 1, Q, T + step·Q) boolean mask of training-time-test step ``step`` for the head indices
    ``queries`` (B, Q), over the keys [step-0 entries (T), step 1 (Q), ..., step ``step`` (Q)].

    Query ``t`` sees the step-0 entries ``t' <= t`` that exist (``valid`` (B, T); the true verifier
    features, as in decoding) and its own chain: its entry of every step ``1..step``. Unlike EAGLE's and
    SpecForge's sdpa code, the step-0 block is not shifted (SafeAILab/EAGLE#247, SpecForge#245): a draft
    at depth ``step`` attends to every committed position, exactly as when decoding.
    """
    keys = torch.arange(valid.shape[1], device=valid.device)
    at = queries.unsqueeze(-1)
    block0 = ((keys <= at) & valid.unsqueeze(1)) | (keys == at)
    own = torch.eye(queries.shape[1], dtype=torch.bool, device=valid.device).expand(queries.shape[0], -1, -1)
    return torch.cat([block0] + [own] * step, dim=-1).unsqueeze(1)


def compact(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (B, W), inside (B, W)): each row's selected positions in ascending order, left-aligned and
    padded with its last position (clamped) to the widest row; ``inside`` marks the real ones."""
    counts = selected.sum(dim=1)
    order = torch.sort((~selected).long(), dim=1, stable=True).indices  # selected first, in order
    width = int(counts.max()) if counts.numel() else 0
    index = order[:, :width]
    inside = torch.arange(width, device=selected.device).unsqueeze(0) < counts.unsqueeze(1)
    last = torch.gather(index, 1, (counts - 1).clamp(min=0).unsqueeze(1)) if width else index[:, :1]
    return torch.where(inside, index, last), inside


class Eagle3Head(nn.Module):
    """fc + one widened decoder layer + final norm + LM head over a draft vocabulary.

    ``embedding`` is the verifier's input embedding: held by reference (not a submodule, so it is never
    saved, trained or cast with the head) unless ``own_embedding`` is set, for checkpoints that ship
    their own. ``verifier_hidden`` is the width of one tap (the verifier's hidden size).
    """

    def __init__(
        self,
        layer_config: PretrainedConfig,
        taps: tuple[int, ...],
        vocab: DraftVocab,
        embedding: nn.Embedding,
        verifier_hidden: int | None = None,
        own_embedding: bool = False,
        norm_before_residual: bool = False,
    ):
        super().__init__()
        config = head_layer_config(layer_config)
        hidden = int(config.hidden_size)
        self.config = config
        self.taps = tuple(taps)
        self.vocab = vocab
        self.verifier_hidden = int(verifier_hidden or hidden)
        self.verifier_layers: int | None = (
            None  # the verifier's depth, when known (default-tap check on export)
        )
        self.norm_before_residual = norm_before_residual
        layer_cls, rotary_cls, norm_cls = decoder_classes(config.model_type)
        self.fc = nn.Linear(len(self.taps) * self.verifier_hidden, hidden, bias=False)
        self.midlayer = layer_cls(config, layer_idx=0)
        attention = self.midlayer.self_attn
        for name in WIDENED:
            old = getattr(attention, name)
            setattr(attention, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        self.midlayer.hidden_norm = norm_cls(hidden, eps=config.rms_norm_eps)
        self.norm = norm_cls(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, vocab.size, bias=False)
        self.rotary_emb = rotary_cls(config=config)
        if embedding.embedding_dim != hidden:
            raise ValueError(f"the embedding has width {embedding.embedding_dim}, the head {hidden}")
        if own_embedding:
            self.embed_tokens = embedding.requires_grad_(False)
            self._shared_embedding: list[nn.Embedding] = []
        else:
            self.embed_tokens = None
            self._shared_embedding = [embedding]

    # --- what the cache adapter (CachedModel) and the rules expect of a model ---------------------------

    @property
    def base_model(self) -> Eagle3Head:
        return self

    @property
    def layers(self) -> nn.ModuleList:
        """The decoder layers (one), where :mod:`specbench.models.taps` looks for them: tap 1 of the head
        (the final norm's input) is its pre-norm output h, the state later draft steps feed back."""
        return nn.ModuleList([self.midlayer])

    @property
    def embedding(self) -> nn.Embedding:
        return self.embed_tokens if self.embed_tokens is not None else self._shared_embedding[0]

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # --- the step ------------------------------------------------------------------------------------

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(..., len(taps)·H_V) concatenated taps → (..., H)."""
        if features.shape[-1] != self.fc.in_features:
            raise ValueError(
                f"verifier features of width {features.shape[-1]}; this head reads {len(self.taps)} taps "
                f"{list(self.taps)} of width {self.verifier_hidden} ({self.fc.in_features})"
            )
        return self.fc(features.to(self.dtype))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids).to(self.dtype)

    def layer(self, embeds, fused, attention_mask, position_ids, cache) -> torch.Tensor:
        """The decoder layer on (embedding, fused feature): the pre-norm output h (B, W, H)."""
        layer = self.midlayer
        normed = layer.hidden_norm(fused)
        residual = normed if self.norm_before_residual else fused
        attention_input = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        position_embeddings = self.rotary_emb(fused, position_ids)
        attended, _ = layer.self_attn(
            hidden_states=attention_input,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )
        hidden = residual + attended
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from pre-norm hidden states."""
        return self.lm_head(self.norm(hidden))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        verifier_features: torch.Tensor | None = None,
        draft_hidden: torch.Tensor | None = None,
        **_: object,
    ) -> Eagle3Output:
        """One head step over (B, W) tokens, each paired with the verifier ``verifier_features`` (B, W,
        len(taps)·H_V) of the position before it, or with the head's own ``draft_hidden`` (B, W, H).

        ``attention_mask`` is HF-style 2-D over cache + new slots; ``cache`` a transformers cache (the
        head's own KV cache, managed by :class:`CachedModel`)."""
        if (verifier_features is None) == (draft_hidden is None):
            raise ValueError("pass exactly one of verifier_features (3·H_V wide) and draft_hidden (H wide)")
        cache = cache if use_cache else None
        fused = self.fuse(verifier_features) if verifier_features is not None else draft_hidden.to(self.dtype)
        embeds = self.embed(input_ids)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(input_ids.shape[1], device=input_ids.device) + past).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )
        hidden = self.layer(embeds, fused, mask, position_ids, cache)
        return Eagle3Output(self.logits(hidden), (fused, hidden) if output_hidden_states else None)

    def unroll(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        valid: torch.Tensor,
        steps: int,
        chains: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Training-time test: ``steps`` head steps over a whole sequence, each on the previous step's output.

        ``input_ids[:, t]`` is token ``t + 1`` (the token paired with the feature at ``t``), ``features``
        (B, T, len(taps)·H_V) the verifier taps at ``t``, ``valid`` (B, T) the indices that pair a real
        feature with a real token. Step ``i`` at index ``t`` embeds token ``t + 1 + i``, sits at position
        ``t + i`` and predicts token ``t + 2 + i`` (as draft ``i + 1`` after committed position ``t``).

        Step 0 runs on every index (its entries are the context every chain attends to); steps >= 1 run
        only on the chains ``chains = (index (B, W), inside (B, W))`` (every index when None): chains that
        reach no counted position are skipped, and a fraction of the rest may be sampled. Returns
        (outputs, index, inside): step 0's (B, T, H) and each later step's (B, W, H) pre-norm outputs.
        """
        batch, length = input_ids.shape
        everything = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(batch, -1)
        cache = _StepCache()
        mask = ttt_mask(valid, everything, 0)
        hidden = self.layer(self.embed(input_ids), self.fuse(features), mask, everything, cache)
        outputs = [hidden]
        index, inside = (everything, valid) if chains is None else chains
        if steps > 1:
            hidden = torch.gather(hidden, 1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        for step in range(1, steps):
            ids = torch.gather(input_ids, 1, (index + step).clamp(max=length - 1))
            hidden = self.layer(self.embed(ids), hidden, ttt_mask(valid, index, step), index + step, cache)
            outputs.append(hidden)
        return outputs, index, inside

    # --- construction ---------------------------------------------------------------------------------

    @classmethod
    def for_verifier(
        cls, verifier: nn.Module, vocab: DraftVocab, taps=None, init_from_verifier: bool = True
    ) -> Eagle3Head:
        """A fresh head for ``verifier`` (a transformers causal LM): its architecture, its embedding; the
        LM head initialised from the verifier's rows of the draft vocabulary and the final norm from the
        verifier's, when ``init_from_verifier``. ``vocab.vocab_size`` is the vocabulary the engine
        compares p and q over (the tokenizer's, ``shared_vocab_size``)."""
        config = verifier.config
        taps = resolve_taps(taps, int(config.num_hidden_layers))
        head = cls(config, taps, vocab, verifier.get_input_embeddings(), int(config.hidden_size))
        head.verifier_layers = int(config.num_hidden_layers)
        if init_from_verifier:
            head.init_from_verifier(verifier)
        param = next(verifier.parameters())
        return head.to(device=param.device)

    @torch.no_grad()
    def init_from_verifier(self, verifier: nn.Module) -> None:
        rows = verifier.get_output_embeddings().weight
        self.lm_head.weight.copy_(self.vocab.restrict(rows.T).T.to(self.lm_head.weight))
        final_norm = getattr(verifier.base_model, "norm", None)
        if final_norm is not None and final_norm.weight.shape == self.norm.weight.shape:
            self.norm.weight.copy_(final_norm.weight)

    @torch.no_grad()
    def init_layer_from_verifier(self, verifier: nn.Module) -> None:
        """Start the decoder layer as the verifier's last layer applied to the highest tap: ``fc`` passes that
        tap through, the hidden half of q/k/v and the rest of the layer are the last layer's weights, the
        embedding half of q/k/v is scaled down. A head that starts in the verifier's own output space
        learns faster from little data than a random one (``train.init_layer=verifier_last``)."""
        source = verifier.base_model.layers[-1]
        hidden = self.verifier_hidden
        if int(verifier.config.hidden_size) != hidden or self.fc.out_features != hidden:
            raise ValueError("train.init_layer=verifier_last needs a head as wide as the verifier")
        top = max(range(len(self.taps)), key=lambda i: self.taps[i])
        self.fc.weight.zero_()
        self.fc.weight[:, top * hidden : (top + 1) * hidden].copy_(torch.eye(hidden))
        attention, original = self.midlayer.self_attn, source.self_attn
        for name in WIDENED:
            widened, weights = getattr(attention, name), getattr(original, name)
            widened.weight[:, hidden:].copy_(weights.weight)
            widened.weight[:, :hidden].mul_(0.1)
            if widened.bias is not None and weights.bias is not None:
                widened.bias.copy_(weights.bias)
        attention.o_proj.load_state_dict(original.o_proj.state_dict())
        self.midlayer.mlp.load_state_dict(source.mlp.state_dict())
        self.midlayer.hidden_norm.weight.copy_(source.input_layernorm.weight)
        self.midlayer.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight)

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
