"""Hand-offs to serving engines (specbench.serving).

Synthetic data through an OpenAI-compatible server: tests/openai_server.py serves the tiny verifier over
real HTTP on 127.0.0.1 (transformers' generate behind FastAPI/uvicorn), the client is the ``openai``
library; rows equal the HF backend's at T = 0, resume, per-row seeds, the concurrency bound, and every
failure names the server.

Drafters in vLLM: vLLM is not installed here, so a scheduler that behaves as vLLM's persistent batch does
(new requests in the lowest free row, finished ones leaving holes that the last rows fill, rows swapped)
calls the proposers' ``propose`` with the numpy arrays vLLM passes; every proposal must equal what a fresh
drafter proposes for that request alone through the Drafter interface.
"""

from __future__ import annotations

import dataclasses
import json
import random
import socket
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from openai_server import serve

from specbench.data.dataset_config import dataset_settings
from specbench.data.datasets import load_dataset_prompts
from specbench.data.synth_dataset import load_synthetic
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.drafters.suffix import SuffixDrafter
from specbench.models import ModelSpec, load_verifier
from specbench.models.tiny import EOS_ID, byte_tokenizer, tiny_random_model
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.serving.openai_backend import (
    OpenAIBackend,
    ServerSettings,
    SynthServerError,
    backend_for,
    verifier_without_weights,
)
from specbench.serving.vllm_proposer import (
    KWARGS_ENV,
    DrafterProposer,
    NgramProposer,
    PromptLookupProposer,
    SpecBenchPLDProposer,
    SuffixProposer,
)

TINY_SPEC = ModelSpec(kind="tiny_random", name="tiny-random-llama", num_layers=2)
DEMO = dataset_settings({"name": "demo"})
# Demo prompts encode to 48..67 byte tokens; "summarize" (184) is skipped: 7 rows of up to 40 new tokens.
GREEDY = SynthSettings(target_len=88, max_prompt_len=80, batch_size=3, validation_fraction=0.2, seed=7,
                       temperature=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def verifier():
    return load_verifier(TINY_SPEC, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def prompts():
    return load_dataset_prompts(DEMO)


@pytest.fixture(scope="module")
def server(verifier):
    with serve(verifier.model, verifier.tokenizer, model_name="tiny-random-llama") as running:
        yield running


@pytest.fixture(scope="module")
def hf_rows(verifier, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    synthesize(verifier, prompts, GREEDY, out, dataset=DEMO, progress=False)
    return rows_of(out)


def rows_of(out) -> list[dict]:
    data, _ = load_synthetic(out)
    return sorted(
        (dict(r) for split in ("train", "validation") for r in data[split]), key=lambda r: r["source_index"]
    )


def server_settings(server, **kwargs) -> ServerSettings:
    return ServerSettings(backend="openai", server_url=server.url, **kwargs)


def run_served(verifier, prompts, out, server, settings=GREEDY, server_kwargs=None, **kwargs):
    backend = backend_for(server_settings(server, **(server_kwargs or {})), verifier, settings)
    return synthesize(
        verifier, prompts, settings, out, dataset=DEMO, progress=False, backend=backend, **kwargs
    )


# --- synthetic data through a server ----------------------------------------------------------------------


def test_greedy_rows_from_the_server_equal_the_hf_backend(verifier, prompts, server, hf_rows, tmp_path):
    before = server.state.requests
    result = run_served(verifier, prompts, tmp_path, server)
    assert rows_of(tmp_path) == hf_rows
    assert (
        server.state.requests - before == len(hf_rows) == 7
    )  # one request per row, none for skipped prompts
    assert sum(len(r["input_ids"]) - r["prompt_len"] for r in hf_rows) > 100
    backend = result.metadata["backend"]
    assert backend["backend"] == "openai" and backend["server_model"] == "tiny-random-llama"
    assert backend["server_url"] == server.url


def test_launch_task_synth_with_the_openai_backend_writes_the_hf_rows(server, hf_rows, tmp_path):
    from helpers import launch

    out = tmp_path / "served"
    settings = [f"synth.{k}={getattr(GREEDY, k)}" for k in (
        "target_len", "max_prompt_len", "batch_size", "validation_fraction", "seed", "temperature")]
    proc = launch([
        "task=synth", "model/verifier=tiny-random", "dataset=demo", "tracking=none", *settings,
        "synth.backend=openai", f"synth.server_url={server.url}", f"synth.output_dir={out}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rows_of(out) == hf_rows
    metadata = json.loads(next(out.glob("dataset*/specbench_synth.json")).read_text())
    assert metadata["backend"]["backend"] == "openai" and metadata["backend"]["server_url"] == server.url
    bad = launch(["task=synth", "model/verifier=tiny-random", "dataset=demo", "tracking=none",
                  "synth.backend=openai", f"synth.output_dir={tmp_path / 'bad'}"])  # fmt: skip
    assert (
        bad.returncode == 2 and "synth.backend=openai needs synth.server_url=http://HOST:PORT" in bad.stderr
    )
    assert "Traceback" not in bad.stderr


def test_a_crashed_served_run_resumes_and_sends_only_the_missing_prompts(
    verifier, prompts, server, hf_rows, tmp_path
):
    class Crash(RuntimeError):
        pass

    def crash(indices, rows):
        raise Crash

    with pytest.raises(Crash):
        run_served(verifier, prompts, tmp_path, server, on_batch=crash)  # dies after its first batch (3 rows)
    before = server.state.requests
    result = run_served(verifier, prompts, tmp_path, server)
    assert result.new_rows == 4 and server.state.requests - before == 4
    assert rows_of(tmp_path) == hf_rows


def test_sampled_rows_have_their_own_seeds_whatever_the_batches(verifier, prompts, server, hf_rows, tmp_path):
    sampled = dataclasses.replace(GREEDY, temperature=1.0)
    run_served(verifier, prompts, tmp_path / "b3", server, settings=sampled)
    run_served(
        verifier, prompts, tmp_path / "b2", server, settings=dataclasses.replace(sampled, batch_size=2)
    )
    rows = rows_of(tmp_path / "b3")
    assert rows == rows_of(tmp_path / "b2")
    assert [r["input_ids"] for r in rows] != [r["input_ids"] for r in hf_rows]  # T = 1 sampled something else


def test_concurrency_is_bounded(verifier, prompts, server, tmp_path):
    wide = dataclasses.replace(GREEDY, batch_size=7)
    server.state.max_in_flight = 0
    run_served(verifier, prompts, tmp_path / "c2", server, settings=wide, server_kwargs={"concurrency": 2})
    assert server.state.max_in_flight == 2
    server.state.max_in_flight = 0
    run_served(verifier, prompts, tmp_path / "c1", server, settings=wide, server_kwargs={"concurrency": 1})
    assert server.state.max_in_flight == 1


def test_an_unreachable_server_is_named(verifier):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}"
    settings = ServerSettings(backend="vllm", server_url=url, max_retries=1, request_timeout_s=5)
    with pytest.raises(SynthServerError, match=rf"synth.server_url={url}: no answer .* after 1 retries"):
        OpenAIBackend(settings, GREEDY, verifier.tokenizer, [EOS_ID])


def test_the_served_model_is_checked(verifier, server):
    with pytest.raises(
        SynthServerError,
        match=r"does not serve synth.server_model='llama'; it serves \['tiny-random-llama'\]",
    ):
        OpenAIBackend(server_settings(server, server_model="llama"), GREEDY, verifier.tokenizer, [EOS_ID])


def test_a_server_without_token_ids_fails_loudly_unless_retokenizing(verifier, prompts, tmp_path):
    with serve(verifier.model, verifier.tokenizer, "tiny", token_ids=False) as text_only:
        with pytest.raises(SynthServerError, match="ignores return_tokens_as_token_ids"):
            run_served(verifier, prompts, tmp_path / "ids", text_only)
        # The random model emits bytes that are not UTF-8: its text cannot re-tokenize to what it sampled.
        with pytest.raises(SynthServerError, match="re-tokenizes to .* but the server generated"):
            run_served(
                verifier, prompts, tmp_path / "text", text_only, server_kwargs={"token_ids": "retokenize"}
            )


def test_retokenized_text_is_accepted_when_it_round_trips(verifier, server):
    """A model that writes ASCII (the tiny model with a -1e4 bias on every non-ASCII token but EOS)."""
    model = tiny_random_model("llama", seed=0, num_layers=2)
    bias = torch.zeros(model.lm_head.out_features)
    bias[128:] = -1e4
    bias[EOS_ID] = 0.0
    model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
    tokenizer = byte_tokenizer()
    with serve(model, tokenizer, "ascii", token_ids=False) as text_only:
        settings = ServerSettings(backend="openai", server_url=text_only.url, token_ids="retokenize")
        backend = OpenAIBackend(settings, GREEDY, tokenizer, [EOS_ID])
        prompt = tokenizer.encode("User: hello\nAssistant: ")
        (ids,), _ = backend.generate([prompt], [24], [1])
    with serve(model, tokenizer, "ascii") as exact:
        exact_backend = OpenAIBackend(
            ServerSettings(backend="openai", server_url=exact.url), GREEDY, tokenizer, [EOS_ID]
        )
        (expected,), _ = exact_backend.generate([prompt], [24], [1])
    assert ids == expected and all(t < 128 or t == EOS_ID for t in ids) and len(ids) > 0


def test_task_path_with_a_checkpoint_loads_no_weights(verifier, prompts, server, hf_rows, tmp_path):
    """What task=synth does for synth.backend=openai: tokenizer + configs only, the server generates."""
    tiny_random_model("llama", seed=0, num_layers=2).save_pretrained(tmp_path / "ckpt")
    byte_tokenizer().save_pretrained(tmp_path / "ckpt")
    light = verifier_without_weights(
        ModelSpec(kind="local", name="tiny-random-llama", path=str(tmp_path / "ckpt"))
    )
    assert next(light.model.parameters()).device.type == "meta"
    assert light.model.generation_config.eos_token_id == EOS_ID
    server_cfg = ServerSettings.from_config({"backend": "openai", "server_url": server.url, "target_len": 88})
    backend = backend_for(server_cfg, light, GREEDY)
    assert backend_for(ServerSettings(), light, GREEDY) is None  # synth.backend=hf: synthesize's own engine
    synthesize(light, prompts, GREEDY, tmp_path / "out", dataset=DEMO, progress=False, backend=backend)
    assert rows_of(tmp_path / "out") == hf_rows


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "sglang"}, "synth.backend must be one of"),
        ({"backend": "openai"}, "needs synth.server_url=http://HOST:PORT"),
        ({"backend": "openai", "server_url": "127.0.0.1:8000"}, "needs synth.server_url"),
        ({"concurrency": 0}, "synth.concurrency must be >= 1"),
        ({"request_timeout_s": 0}, "synth.request_timeout_s must be > 0"),
        ({"max_retries": -1}, "synth.max_retries must be >= 0"),
        ({"token_ids": "guess"}, "synth.token_ids must be one of"),
    ],
)
def test_server_settings_name_the_bad_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerSettings(**kwargs)


def test_server_url_gets_the_v1_prefix_once():
    assert ServerSettings(backend="vllm", server_url="http://h:8000").base_url == "http://h:8000/v1"
    assert ServerSettings(backend="vllm", server_url="http://h:8000/v1/").base_url == "http://h:8000/v1"


# --- drafters as vLLM proposers
# ------------------------------------------------------------------------------


def vllm_config(k: int = 4, max_model_len: int = 512, **spec) -> SimpleNamespace:
    """The attributes of vLLM's VllmConfig that a custom_class proposer reads."""
    speculative = SimpleNamespace(
        method="custom_class", num_speculative_tokens=k, prompt_lookup_min=None, prompt_lookup_max=None,
        suffix_decoding_max_tree_depth=24, suffix_decoding_max_cached_requests=10000,
        suffix_decoding_max_spec_factor=1.0, suffix_decoding_min_token_prob=0.1,
    )  # fmt: skip
    for key, value in spec.items():
        setattr(speculative, key, value)
    model = SimpleNamespace(max_model_len=max_model_len, hf_config=SimpleNamespace(eos_token_id=EOS_ID))
    return SimpleNamespace(speculative_config=speculative, model_config=model,
                           scheduler_config=SimpleNamespace(max_num_seqs=8))  # fmt: skip


def oracle(make_drafter, context: list[int], cap: int) -> list[int]:
    """What a fresh drafter proposes for this context alone, through the Drafter interface."""
    drafter = make_drafter()
    state = BatchState.create([context], cap or 1, 10**6, (EOS_ID,), 0, torch.device("cpu"))
    drafter.reset(1)
    drafter.prefill(state, None)
    sampler = DraftSampler(Warping(), torch.Generator(), DraftSchedule())
    proposal = drafter.propose(state, torch.tensor([cap]), sampler)
    return proposal.tokens[0, : int(proposal.lengths[0])].tolist()


def target_text(rng: random.Random, length: int) -> list[int]:
    """Token streams with repeats (phrases recur), so lookups match and drafts get accepted."""
    phrases = [[rng.randrange(30, 40) for _ in range(rng.randrange(3, 7))] for _ in range(5)]
    out: list[int] = []
    while len(out) < length:
        out += rng.choice(phrases) if rng.random() < 0.7 else [rng.randrange(30, 40)]
    return out[:length]


class FakeBatch:
    """vLLM's persistent batch as a custom proposer sees it: token_ids_cpu / num_tokens_no_spec rows."""

    def __init__(self, max_reqs: int, max_model_len: int):
        self.token_ids_cpu = np.zeros((max_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_reqs, dtype=np.int32)
        self.rows: list[dict | None] = []

    def add(self, request: dict) -> None:
        free = next((i for i, r in enumerate(self.rows) if r is None), len(self.rows))  # lowest free row
        if free == len(self.rows):
            self.rows.append(None)
        self.rows[free] = request
        self._write(free)

    def _write(self, row: int) -> None:
        request = self.rows[row]
        tokens = request["prompt"] + request["output"]
        self.token_ids_cpu[row, : len(tokens)] = tokens
        self.num_tokens_no_spec[row] = len(tokens)

    def remove(self, request: dict) -> None:
        row = self.rows.index(request)
        self.rows[row] = None
        self.num_tokens_no_spec[row] = 0

    def condense(self) -> None:
        """Move the last requests into the holes (vLLM's InputBatch.condense)."""
        while None in self.rows:
            hole = self.rows.index(None)
            while self.rows and self.rows[-1] is None:
                self.rows.pop()
            if hole >= len(self.rows):
                break
            self.rows[hole] = self.rows.pop()
            self._write(hole)
            self.num_tokens_no_spec[len(self.rows)] = 0

    def swap(self, a: int, b: int) -> None:
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        for row in (a, b):
            if self.rows[row] is not None:
                self._write(row)
            else:
                self.num_tokens_no_spec[row] = 0


def simulate(proposer, make_drafter, rng: random.Random, check=True, requests: int = 7, steps: int = 60):
    """Requests arrive, decode against their target (greedy acceptance: the longest prefix of the drafts that
    matches), finish, and move rows as in vLLM; returns (accepted drafts, non-empty proposals, moves)."""
    batch = FakeBatch(max_reqs=8, max_model_len=proposer.max_model_len)
    pending = [
        {"prompt": target_text(rng, rng.randrange(20, 60)), "target": target_text(rng, rng.randrange(30, 70)),
         "output": [], "drafts": None, "arrive": rng.randrange(0, steps // 2)}
        for _ in range(requests)
    ]  # fmt: skip
    accepted_total, proposals, moves = 0, 0, 0
    for step in range(steps):
        for request in [r for r in pending if r["arrive"] == step]:
            batch.add(request)
        sampled = []
        for request in batch.rows:
            if request is None:
                sampled.append([])
                continue
            position = len(request["output"])
            drafts = request["drafts"] or []
            truth = request["target"][position:]
            accepted = 0
            while (
                accepted < len(drafts) and accepted < len(truth) - 1 and drafts[accepted] == truth[accepted]
            ):
                accepted += 1
            new = truth[: accepted + 1]  # the prefill step samples one token; later steps n drafts + 1
            accepted_total += accepted
            request["output"] += new
            sampled.append(new)
        for row, request in enumerate(batch.rows):
            if request is not None:
                batch._write(row)
        drafts = proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu, None)
        assert len(drafts) == len(sampled)
        for row, request in enumerate(batch.rows):
            if request is None:
                assert drafts[row] == []
                continue
            request["drafts"] = drafts[row]
            proposals += bool(drafts[row])
            if check:
                context = request["prompt"] + request["output"]
                cap = min(proposer.num_speculative_tokens, proposer.max_model_len - len(context))
                assert drafts[row] == oracle(make_drafter, context, cap), (step, row)
        for request in list(batch.rows):
            if request is not None and len(request["output"]) >= len(request["target"]):
                batch.remove(request)
        if step % 7 == 3:
            batch.condense()
            moves += 1
        if step % 11 == 5 and len(batch.rows) >= 2:
            batch.swap(0, len(batch.rows) - 1)
            moves += 1
    return accepted_total, proposals, moves


@pytest.mark.parametrize(
    ("proposer_class", "spec", "make_drafter"),
    [
        (PromptLookupProposer, {}, lambda: PromptLookupDrafter(2, 4)),
        (PromptLookupProposer, {"prompt_lookup_max": 3}, lambda: PromptLookupDrafter(3, 4)),
        (SpecBenchPLDProposer, {}, lambda: PromptLookupDrafter(3, 4, match_rule="spec-bench")),
        (NgramProposer, {"prompt_lookup_min": 2, "prompt_lookup_max": 4}, lambda: NgramDrafter(2, 4, 4)),
        (SuffixProposer, {"suffix_decoding_max_cached_requests": 0},
         lambda: SuffixDrafter(max_cached_requests=0, num_speculative_tokens=4, backend="python")),
    ],
)  # fmt: skip
def test_proposals_equal_a_fresh_drafter_as_vllm_moves_rows(proposer_class, spec, make_drafter, monkeypatch):
    if proposer_class is SuffixProposer:
        monkeypatch.setenv(KWARGS_ENV, json.dumps({"backend": "python"}))
    proposer = proposer_class(vllm_config(k=4, max_model_len=512, **spec))
    accepted, proposals, moves = simulate(proposer, make_drafter, random.Random(5))
    assert accepted > 30 and proposals > 30 and moves > 5  # drafts were made, kept and rows moved


def test_proposals_stop_at_max_model_len():
    proposer = NgramProposer(vllm_config(k=4, max_model_len=12, prompt_lookup_min=1, prompt_lookup_max=2))
    tokens = np.zeros((2, 12), dtype=np.int32)
    tokens[0, :10] = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    tokens[1, :12] = [1, 2] * 6
    drafts = proposer.propose([[6], [2]], np.array([10, 12]), tokens)
    assert drafts == [[7, 8], []]  # 2 tokens left before max_model_len; a full row gets none
    # A torch tensor, as older vLLM passed token_ids_cpu, works the same.
    tokens[0, 10] = 7
    assert proposer.propose([[7], [2]], np.array([11, 12]), torch.from_numpy(tokens)) == [[8], []]


def test_suffix_global_tree_spans_requests_as_in_the_engine(monkeypatch):
    """Request B repeats request A's output: after A, the global tree drafts it; the proposer's drafts equal
    a SuffixDrafter that saw A then B through the Drafter interface (the engine's use)."""
    monkeypatch.setenv(KWARGS_ENV, json.dumps({"backend": "python"}))
    rng = random.Random(1)
    answer = target_text(rng, 40)
    prompts = [target_text(rng, 25), target_text(rng, 30)]
    proposer = SuffixProposer(vllm_config(k=6, max_model_len=512))
    reference = SuffixDrafter(num_speculative_tokens=6, backend="python")
    sampler = DraftSampler(Warping(), torch.Generator(), DraftSchedule())
    accepted = []
    for prompt in prompts:
        reference.reset(1)
        state = BatchState.create([prompt], 6, 10**6, (EOS_ID,), 0, torch.device("cpu"))
        reference.prefill(state, None)
        output, drafts, kept = [], [], 0
        while len(output) < len(answer):
            truth = answer[len(output):]
            n = 0
            while n < len(drafts) and n < len(truth) - 1 and drafts[n] == truth[n]:
                n += 1
            new = truth[: n + 1]
            kept += n
            output += new
            context = prompt + output
            tokens = np.zeros((1, 512), dtype=np.int32)
            tokens[0, : len(context)] = context
            drafts = proposer.propose([new], np.array([len(context)]), tokens)[0]
            state = BatchState.create([context], 6, 10**6, (EOS_ID,), 0, torch.device("cpu"))
            reference.commit(state, None, torch.tensor([n]))
            expected = reference.propose(state, torch.tensor([6]), sampler)
            assert drafts == expected.tokens[0, : int(expected.lengths[0])].tolist()
        proposer.propose([], np.zeros(0, dtype=np.int32), np.zeros((0, 512), dtype=np.int32))  # A leaves
        accepted.append(kept)
    assert accepted[1] > accepted[0] + 10  # B drafts A's answer from the global tree


def test_vllm_parameters_and_environment_overrides(monkeypatch):
    ngram = NgramProposer(vllm_config(k=3))
    assert (ngram.drafter.prompt_lookup_min, ngram.drafter.prompt_lookup_max) == (5, 5)  # vLLM's default
    assert ngram.drafter.num_speculative_tokens == 3
    monkeypatch.setenv(KWARGS_ENV, '{"match_rule": "spec-bench", "max_matching_ngram_size": 4}')
    pld = PromptLookupProposer(vllm_config(k=7))
    assert (pld.drafter.match_rule, pld.drafter.max_matching_ngram_size, pld.drafter.num_output_tokens) == (
        "spec-bench", 4, 7
    )
    monkeypatch.setenv(KWARGS_ENV, "{not json")
    with pytest.raises(ValueError, match=f"{KWARGS_ENV} must be a JSON object"):
        PromptLookupProposer(vllm_config())


def test_only_model_free_drafters_are_exported():
    drafter = ModelDrafter(tiny_random_model("llama", seed=1, num_layers=1), 259)
    with pytest.raises(ValueError, match="vLLM's custom_class hook passes token ids only"):
        DrafterProposer(vllm_config(), drafter=drafter)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        PromptLookupProposer(SimpleNamespace(speculative_config=None))
    proposer = DrafterProposer(vllm_config(), drafter=PromptLookupDrafter())
    assert proposer.load_model() is None  # vLLM calls it; nothing to load
