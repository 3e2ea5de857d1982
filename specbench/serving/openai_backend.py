"""Synthetic data from an OpenAI-compatible server (``synth.backend=openai``, e.g. ``vllm serve``).

:class:`OpenAIBackend` is a :class:`~specbench.pipelines.synthesize.ResponseBackend`: ``task=synth`` encodes
the prompts exactly as for the HF backend (same chat template, same token ids, same shards, resume and rows)
and sends each one to ``POST {synth.server_url}/v1/completions`` **as token ids**, with the run's sampling
settings (temperature, top_p, top_k), the row's budget and the row's seed. How the generated token ids come
back (``synth.token_ids``):

- ``server`` (default, vLLM): ``logprobs=1`` with vLLM's ``return_tokens_as_token_ids``, so every generated
  token comes back as ``"token_id:N"``, exact. A server that does not honour it is an error.
- ``retokenize`` (servers that return text only): the text is encoded again with the verifier's tokenizer
  and the count checked against the server's ``usage.completion_tokens``; a mismatch (the text does not
  re-tokenize to what was sampled) is an error, never silently different rows.

Requests run concurrently, at most ``synth.concurrency`` at once; the client retries a failed request
``synth.max_retries`` times (connection errors, 408/429/5xx) with backoff, and a server that cannot be
reached stops the run with an error that names ``synth.server_url``. At T = 0 the rows equal the HF
backend's when the server computes the same argmaxes (the same weights and dtype); at T > 0 each row is
sampled with its own seed, so rows do not depend on the batch they ran in (the server's random numbers are
not specbench's: T > 0 rows differ from the HF backend's, as samples of the same distribution). LM-head rows
beyond the tokenizer (vocabulary padding) get a -100 ``logit_bias``, so the server samples from the same
vocabulary as the HF engine.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

    from specbench.models.loading import LoadedModel, ModelSpec
    from specbench.pipelines.synth_plan import SynthSettings

BACKENDS = ("hf", "openai", "vllm")  # vllm: an alias of openai (vllm serve is an OpenAI-compatible server)
TOKEN_ID_MODES = ("server", "retokenize")
TOKEN_ID_PREFIX = "token_id:"
SEED_MASK = 0x7FFFFFFF  # seeds are sent as 31-bit integers: every server parses those


class SynthServerError(RuntimeError):
    """The server is unreachable, refused a request or returned what cannot be a row; names the URL."""


@dataclass(frozen=True)
class ServerSettings:
    """The ``synth.*`` keys of the serving backend. Bad values raise ValueError naming the key."""

    backend: str = "hf"
    server_url: str | None = None
    server_model: str | None = None  # None: the one model the server lists
    concurrency: int = 64
    request_timeout_s: float = 600.0
    max_retries: int = 3
    token_ids: str = "server"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"synth.backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.remote:
            url = self.server_url or ""
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"synth.backend={self.backend} needs synth.server_url=http://HOST:PORT (the server's "
                    "address), "
                    f"got {self.server_url!r}"
                )
        if self.concurrency < 1:
            raise ValueError(f"synth.concurrency must be >= 1, got {self.concurrency}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"synth.request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"synth.max_retries must be >= 0, got {self.max_retries}")
        if self.token_ids not in TOKEN_ID_MODES:
            raise ValueError(f"synth.token_ids must be one of {list(TOKEN_ID_MODES)}, got {self.token_ids!r}")

    @property
    def remote(self) -> bool:
        """Whether the responses come from a server (not this process's HF engine)."""
        return self.backend != "hf"

    @property
    def base_url(self) -> str:
        """``server_url`` with the ``/v1`` the OpenAI client expects."""
        url = (self.server_url or "").rstrip("/")
        return url if url.endswith("/v1") else f"{url}/v1"

    @classmethod
    def from_config(cls, node: Any) -> ServerSettings:
        """From a ``synth`` config node or mapping (other keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: node[name] for name in names if name in node})


class OpenAIBackend:
    """Responses of a batch from an OpenAI-compatible ``/v1/completions`` endpoint (see the module doc)."""

    def __init__(
        self,
        server: ServerSettings,
        sampling: SynthSettings,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: Sequence[int],
        model_vocab_size: int | None = None,
    ):
        import openai

        if not server.remote:
            raise ValueError("OpenAIBackend needs synth.backend=openai (or vllm) and synth.server_url")
        self.server = server
        self.sampling = sampling
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.vocab_size = len(tokenizer)
        # LM-head rows past the tokenizer (padding) are out of the vocabulary the HF engine samples from:
        # a -100 logit bias takes them out on the server too (a few hundred entries, e.g. Qwen3's 267).
        self.logit_bias = {str(t): -100 for t in range(self.vocab_size, model_vocab_size or 0)}
        self.url = server.base_url
        self._errors = openai
        self.client = openai.OpenAI(
            base_url=self.url,
            api_key=os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=server.request_timeout_s,
            max_retries=server.max_retries,
        )
        self.model = self._resolve_model(server.server_model)

    # -- setup ----------------------------------------------------------------------------------------------

    def _resolve_model(self, wanted: str | None) -> str:
        try:
            listed = [m.id for m in self.client.models.list()]
        except Exception as err:
            raise self._failure(err, "listing its models") from err
        if wanted is None:
            if len(listed) != 1:
                raise SynthServerError(
                    f"synth.server_url={self.server.server_url} serves {listed}: set synth.server_model to "
                    "the one "
                    "that is model.verifier"
                )
            return listed[0]
        if wanted not in listed:
            raise SynthServerError(
                f"synth.server_url={self.server.server_url} does not serve synth.server_model={wanted!r}; it "
                "serves "
                f"{listed}"
            )
        return wanted

    def _failure(self, err: Exception, doing: str) -> SynthServerError:
        url = self.server.server_url
        errors = self._errors
        if isinstance(err, (errors.APIConnectionError, errors.APITimeoutError)):
            return SynthServerError(
                f"synth.server_url={url}: no answer while {doing} after {self.server.max_retries} retries "
                f"({type(err).__name__}: {err}); start the server (e.g. `vllm serve MODEL --port PORT`), "
                "check "
                "the address, or raise synth.request_timeout_s"
            )
        if isinstance(err, errors.APIStatusError):
            return SynthServerError(
                f"synth.server_url={url}: HTTP {err.status_code} while {doing}: {err.message}"
            )
        return SynthServerError(f"synth.server_url={url}: {type(err).__name__} while {doing}: {err}")

    # -- ResponseBackend ----------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "openai",
            "server_url": self.server.server_url,
            "server_model": self.model,
            "token_ids": self.server.token_ids,
            "concurrency": self.server.concurrency,
        }

    def generate(
        self, prompts: list[list[int]], budgets: list[int], seeds: list[int]
    ) -> tuple[list[list[int]], float]:
        start = time.perf_counter()
        workers = min(self.server.concurrency, len(prompts))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth-openai") as pool:
            outputs = list(pool.map(self.complete, prompts, budgets, seeds))
        return outputs, time.perf_counter() - start

    def complete(self, prompt: list[int], budget: int, seed: int) -> list[int]:
        """One row: the generated ids (EOS included when it ended there) for ``prompt``."""
        settings = self.sampling
        exact = self.server.token_ids == "server"
        extra: dict[str, Any] = {"top_k": settings.top_k if settings.top_k > 0 else -1}
        if exact:
            extra["return_tokens_as_token_ids"] = True
        try:
            response = self.client.completions.create(
                model=self.model,
                prompt=list(prompt),
                max_tokens=int(budget),
                temperature=settings.temperature,
                top_p=settings.top_p,
                seed=int(seed) & SEED_MASK,
                n=1,
                stream=False,
                **({"logit_bias": self.logit_bias} if self.logit_bias else {}),
                **({"logprobs": 1} if exact else {}),
                extra_body=extra,
            )
        except Exception as err:
            raise self._failure(err, f"completing a prompt of {len(prompt)} tokens") from err
        if not response.choices:
            raise SynthServerError(
                f"synth.server_url={self.server.server_url} returned no choice for a prompt"
            )
        choice = response.choices[0]
        ids = self._server_ids(choice) if exact else self._retokenized_ids(choice, response)
        if len(ids) > budget:
            raise SynthServerError(
                f"synth.server_url={self.server.server_url} returned {len(ids)} tokens for "
                f"max_tokens={budget}"
            )
        return ids

    # -- token ids ------------------------------------------------------------------------------------------

    def _server_ids(self, choice: Any) -> list[int]:
        tokens = getattr(getattr(choice, "logprobs", None), "tokens", None)
        url = self.server.server_url
        if tokens is None:
            raise SynthServerError(
                f"synth.server_url={url} returned no tokens for logprobs=1 with return_tokens_as_token_ids: "
                "it "
                "cannot give exact token ids; use vLLM, or synth.token_ids=retokenize for a text-only server"
            )
        ids = []
        for token in tokens:
            if not (isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX)):
                raise SynthServerError(
                    f"synth.server_url={url} returned the token {token!r}, not '{TOKEN_ID_PREFIX}N': it "
                    "ignores "
                    "return_tokens_as_token_ids; use vLLM, or synth.token_ids=retokenize"
                )
            ids.append(int(token[len(TOKEN_ID_PREFIX):]))
        ids = self._with_stop_token(ids, choice)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise SynthServerError(
                f"synth.server_url={url} returned token id {bad[0]}, outside model.verifier's tokenizer "
                f"({self.vocab_size} tokens): does synth.server_model={self.model!r} serve model.verifier?"
            )
        return ids

    def _retokenized_ids(self, choice: Any, response: Any) -> list[int]:
        ids = self.tokenizer.encode(choice.text or "", add_special_tokens=False)
        ids = self._with_stop_token(ids, choice)
        generated = getattr(getattr(response, "usage", None), "completion_tokens", None)
        if generated != len(ids):
            raise SynthServerError(
                f"synth.token_ids=retokenize: the text from synth.server_url={self.server.server_url} "
                "re-tokenizes "
                f"to {len(ids)} tokens but the server generated {generated}: these would not be the ids it "
                "sampled; "
                "use a server that returns token ids (vLLM) with synth.token_ids=server"
            )
        return ids

    def _with_stop_token(self, ids: list[int], choice: Any) -> list[int]:
        """The ids with the EOS token that ended the row, when the server left it out."""
        if getattr(choice, "finish_reason", None) != "stop" or (ids and ids[-1] in self.eos_token_ids):
            return ids
        extra = getattr(choice, "model_extra", None) or {}
        stop = getattr(choice, "stop_reason", extra.get("stop_reason"))
        if isinstance(stop, int) and not isinstance(stop, bool):
            return [*ids, stop]  # vLLM: the stop token id (e.g. one of the generation config's EOS ids)
        if stop is None and self.tokenizer.eos_token_id is not None:
            return [*ids, int(self.tokenizer.eos_token_id)]  # vLLM: stopped on the tokenizer's EOS
        return ids


# --- what task=synth needs ----------------------------------------------------------------------------------


def verifier_without_weights(spec: ModelSpec, dtype: str = "auto") -> LoadedModel:
    """The verifier's tokenizer, config and generation config, its weights not loaded (meta device).

    ``task=synth`` with a server backend needs what encodes prompts and decides EOS, not a 70B model in
    memory. A ``tiny_random`` spec is built as it is (it has no checkpoint to read a config from).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from specbench.models.devices import resolve_dtype
    from specbench.models.embedded import embedded_model_dir
    from specbench.models.loading import LoadedModel, load_verifier
    from specbench.models.spec import model_name

    if spec.kind == "tiny_random":
        return load_verifier(spec, device="cpu", dtype="float32")
    if spec.kind not in ("hub", "local", "embedded"):
        raise ValueError(
            f"model/verifier: kind={spec.kind!r} cannot be served; use a hub, local or embedded model"
        )
    path = str(embedded_model_dir()) if spec.kind == "embedded" else os.path.expanduser(spec.path or "")
    revision = spec.revision if spec.kind == "hub" else None
    common = {"revision": revision, "trust_remote_code": spec.trust_remote_code}
    config = AutoConfig.from_pretrained(path, **common)
    tokenizer = AutoTokenizer.from_pretrained(path, **common)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(  # "auto": bf16, what a GPU server runs (metadata only)
            config, dtype=torch.bfloat16 if dtype == "auto" else resolve_dtype(dtype),
            trust_remote_code=spec.trust_remote_code,
        )
    try:
        model.generation_config = GenerationConfig.from_pretrained(path, revision=revision)
    except OSError:
        pass  # no generation_config.json: the one from_config derived from the model config stays
    model.eval()
    return LoadedModel(model, tokenizer, spec, model_name(spec))


def backend_for(
    server: ServerSettings, verifier: LoadedModel, sampling: SynthSettings
) -> OpenAIBackend | None:
    """The backend ``synthesize`` should use: None (its HF engine) for ``synth.backend=hf``."""
    if not server.remote:
        return None
    from specbench.evaluation import eos_token_ids

    rows = int(verifier.model.get_output_embeddings().weight.shape[0])
    return OpenAIBackend(
        server, sampling, verifier.tokenizer, eos_token_ids(verifier.model, verifier.tokenizer), rows
    )
