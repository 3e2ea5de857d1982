"""CachedModel (methods.md §3.3): crop-and-refeed must reproduce a fresh forward over the committed tokens.

Every check compares the logits of the cached model with a fresh, cache-free, unpadded run of the model
on exactly the tokens a row has committed, so left padding, rejected draft slots (holes), compaction
and row selection must all be invisible.
"""

from __future__ import annotations

import functools

import pytest
import torch

from specbench.decoding.cache import CachedModel
from specbench.models.tiny import tiny_random_model

ATOL = 1e-5
VOCAB = 320



@functools.cache
def model(arch):
    return tiny_random_model(arch, seed=3)


@torch.no_grad()
def fresh_logits(arch, tokens: list[int]) -> torch.Tensor:
    """(len(tokens), V) logits of a cache-free forward of one unpadded row."""
    return model(arch)(torch.tensor([tokens])).logits[0].float()


def tokens(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def assert_row_matches(arch, out_logits, valid, row, committed_before, new_tokens):
    """Logits of ``row`` at its valid input columns == fresh run on committed_before + new_tokens."""
    full = committed_before + new_tokens
    expected = fresh_logits(arch, full)[len(committed_before):]
    got = out_logits[row][valid[row]]
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def assert_compact(cm: CachedModel):
    """No rejected slot stays inside a row's context and no column is unused by every row."""
    valid = cm.valid
    if valid.shape[1] == 0:
        return
    # Each row's valid slots are contiguous and right-aligned.
    for row in valid:
        n = int(row.sum())
        assert row[valid.shape[1] - n:].all() and not row[: valid.shape[1] - n].any()
    assert valid.any(dim=0).all()
    for layer in cm.cache.layers:
        if getattr(layer, "is_initialized", False):
            assert layer.keys.shape[2] == valid.shape[1]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_crop_and_refeed_single_row(arch):
    cm = CachedModel(model(arch), VOCAB)
    cm.reset(1)
    seq = tokens(0, 8)
    out = cm.forward(torch.tensor([seq]))
    torch.testing.assert_close(out.logits[0], fresh_logits(arch, seq), atol=ATOL, rtol=0)
    cm.keep(torch.tensor([5]))
    assert cm.num_valid.tolist() == [5]
    new = tokens(1, 4)
    out = cm.forward(torch.tensor([new]))
    assert_row_matches(arch, out.logits, torch.ones(1, 4, dtype=torch.bool), 0, seq[:5], new)
    # Repeated rounds: crop one, feed one.
    committed = seq[:5] + new
    for step in range(3):
        cm.keep(torch.tensor([len(committed) - 1]))
        committed = committed[:-1]
        nxt = tokens(10 + step, 2)
        out = cm.forward(torch.tensor([nxt]))
        assert_row_matches(arch, out.logits, torch.ones(1, 2, dtype=torch.bool), 0, committed, nxt)
        committed += nxt
    assert cm.num_valid.tolist() == [len(committed)]


def test_rejected_slots_at_the_end_of_a_single_row_are_cropped_without_copying_the_cache():
    cm = CachedModel(model("llama"), VOCAB)
    cm.reset(1)
    cm.forward(torch.tensor([tokens(0, 12)]))
    before = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cm._layers()]
    cm.keep(torch.tensor([9]))
    assert cm.valid.shape == (1, 9) and bool(cm.valid.all())
    for layer, (keys, values) in zip(cm._layers(), before):
        assert layer.keys.shape[2] == 9
        assert (layer.keys.data_ptr(), layer.values.data_ptr()) == (keys, values)  # views: nothing gathered


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batch_with_left_padding_and_rejected_slots(arch):
    """Two rows of different lengths: left padding, a draft block with per-row lengths, different crops."""
    cm = CachedModel(model(arch), VOCAB)
    cm.reset(2)
    row0, row1 = tokens(2, 7), tokens(3, 3)
    width = 7
    ids = torch.tensor([row0, [0] * (width - 3) + row1])
    valid = torch.tensor([[True] * 7, [False] * 4 + [True] * 3])
    out = cm.forward(ids, valid)
    assert_row_matches(arch, out.logits, valid, 0, [], row0)
    assert_row_matches(arch, out.logits, valid, 1, [], row1)
    assert cm.num_valid.tolist() == [7, 3]

    # A "round": row 0 feeds 4 tokens, row 1 feeds 2 (its last two columns are invalid padding).
    d0, d1 = tokens(4, 4), tokens(5, 2)
    block = torch.tensor([d0, d1 + [0, 0]])
    block_valid = torch.tensor([[True] * 4, [True, True, False, False]])
    out = cm.forward(block, block_valid)
    assert_row_matches(arch, out.logits, block_valid, 0, row0, d0)
    assert_row_matches(arch, out.logits, block_valid, 1, row1, d1)

    # Row 0 keeps 1 of its 4 new tokens, row 1 keeps both: holes in row 0, padding in row 1.
    cm.keep(torch.tensor([8, 5]))
    assert cm.num_valid.tolist() == [8, 5]
    assert_compact(cm)
    committed0, committed1 = row0 + d0[:1], row1 + d1

    # Refeed different tokens; then another round that crops row 1 into its prompt.
    e0, e1 = tokens(6, 3), tokens(7, 3)
    out = cm.forward(torch.tensor([e0, e1]))
    assert_row_matches(arch, out.logits, torch.ones(2, 3, dtype=torch.bool), 0, committed0, e0)
    assert_row_matches(arch, out.logits, torch.ones(2, 3, dtype=torch.bool), 1, committed1, e1)
    committed0, committed1 = committed0 + e0, committed1 + e1
    cm.keep(torch.tensor([len(committed0), 2]))
    committed1 = committed1[:2]
    assert_compact(cm)
    f0, f1 = tokens(8, 1), tokens(9, 5)
    block = torch.tensor([[0] * 4 + f0, f1])
    block_valid = torch.tensor([[False] * 4 + [True], [True] * 5])
    out = cm.forward(block, block_valid)
    assert_row_matches(arch, out.logits, block_valid, 0, committed0, f0)
    assert_row_matches(arch, out.logits, block_valid, 1, committed1, f1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_select_rows(arch):
    cm = CachedModel(model(arch), VOCAB)
    cm.reset(3)
    rows = [tokens(20, 6), tokens(21, 2), tokens(22, 4)]
    ids = torch.tensor([[0] * (6 - len(r)) + r for r in rows])
    valid = torch.tensor([[False] * (6 - len(r)) + [True] * len(r) for r in rows])
    cm.forward(ids, valid)
    # Drop the longest row: the remaining ones lose their shared padding columns.
    cm.select_rows(torch.tensor([1, 2]))
    assert cm.num_valid.tolist() == [2, 4]
    assert_compact(cm)
    assert cm.valid.shape[1] == 4
    new = [tokens(23, 2), tokens(24, 2)]
    out = cm.forward(torch.tensor(new))
    for i, r in enumerate([rows[1], rows[2]]):
        assert_row_matches(arch, out.logits, torch.ones(2, 2, dtype=torch.bool), i, r, new[i])
    # Reordering rows works too.
    cm.select_rows(torch.tensor([1, 0]))
    assert cm.num_valid.tolist() == [6, 4]
    out = cm.forward(torch.tensor([tokens(25, 1), tokens(26, 1)]))
    assert_row_matches(
        arch, out.logits, torch.ones(2, 1, dtype=torch.bool), 0, rows[2] + new[1], tokens(25, 1)
    )
    assert_row_matches(
        arch, out.logits, torch.ones(2, 1, dtype=torch.bool), 1, rows[1] + new[0], tokens(26, 1)
    )
    # No rows left.
    cm.select_rows(torch.tensor([], dtype=torch.long))
    assert cm.valid.shape[0] == 0


def test_keep_everything_and_nothing():
    arch = "llama"
    cm = CachedModel(model(arch), VOCAB)
    cm.reset(2)
    seq = tokens(30, 5)
    cm.forward(torch.tensor([seq, seq]))
    cm.keep(torch.tensor([5, 0]))  # row 1 drops its whole context
    assert cm.num_valid.tolist() == [5, 0]
    other = tokens(31, 3)
    out = cm.forward(torch.tensor([other, other]))
    assert_row_matches(arch, out.logits, torch.ones(2, 3, dtype=torch.bool), 0, seq, other)
    assert_row_matches(arch, out.logits, torch.ones(2, 3, dtype=torch.bool), 1, [], other)
    cm.keep(torch.tensor([0, 0]))
    assert cm.num_valid.tolist() == [0, 0]
    out = cm.forward(torch.tensor([seq[:2], other[:2]]))
    assert_row_matches(arch, out.logits, torch.ones(2, 2, dtype=torch.bool), 0, [], seq[:2])
    assert_row_matches(arch, out.logits, torch.ones(2, 2, dtype=torch.bool), 1, [], other[:2])


def test_vocab_slicing_and_hidden_states():
    arch = "qwen3"
    cm = CachedModel(model(arch), 259)
    cm.reset(1)
    seq = tokens(40, 6)
    out = cm.forward(torch.tensor([seq]), output_hidden=True)
    assert out.logits.shape == (1, 6, 259) and out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits[0], fresh_logits(arch, seq)[:, :259], atol=ATOL, rtol=0)
    assert out.hidden.shape == (1, 6, model(arch).config.hidden_size)
    assert out.taps == {}
    # "last-layer hidden state after the final norm": the LM head applied to it gives the logits.
    with torch.no_grad():
        relogits = model(arch).lm_head(out.hidden)[..., :259]
    torch.testing.assert_close(relogits, out.logits, atol=ATOL, rtol=0)
    depth = model(arch).config.num_hidden_layers
    out = cm.forward(torch.tensor([tokens(41, 2)]), output_taps=(0, depth))
    assert sorted(out.taps) == [0, depth] and out.hidden is None


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_row_with_only_padding_in_a_block(arch):
    """A row whose first block is all padding (a one-token prompt next to a longer one at prefill)."""
    cm = CachedModel(model(arch), VOCAB)
    cm.reset(2)
    long = tokens(50, 5)
    out = cm.forward(torch.tensor([long, [0] * 5]), torch.tensor([[True] * 5, [False] * 5]))
    assert torch.isfinite(out.logits[0]).all()
    assert cm.num_valid.tolist() == [5, 0]
    short = tokens(51, 1)
    nxt = tokens(52, 1)
    out = cm.forward(torch.tensor([nxt, short]))
    assert_row_matches(arch, out.logits, torch.ones(2, 1, dtype=torch.bool), 0, long, nxt)
    assert_row_matches(arch, out.logits, torch.ones(2, 1, dtype=torch.bool), 1, [], short)
    for layer in cm.cache.layers:
        if getattr(layer, "is_initialized", False):
            # Whatever the padded slots hold, it must not leak: every valid slot is finite.
            assert torch.isfinite(layer.keys.transpose(1, 2)[cm.valid]).all()
            assert torch.isfinite(layer.values.transpose(1, 2)[cm.valid]).all()


@pytest.mark.parametrize("hidden", [False, True])
def test_a_forward_without_logits_runs_the_body_and_fills_the_same_cache(hidden):
    """``logits=False`` (the engine's prefill): no LM head, the final-normed hidden state on request, and the
    next forward's logits are those after a prefill with logits."""
    arch = "llama"
    context, block = tokens(5, 9), tokens(6, 3)
    plain, bare = CachedModel(model(arch), VOCAB), CachedModel(model(arch), VOCAB)
    plain.reset(1)
    bare.reset(1)
    full = plain.forward(torch.tensor([context]), output_hidden=hidden)
    body = bare.forward(torch.tensor([context]), output_hidden=hidden, logits=False)
    assert body.logits is None and full.logits.shape == (1, 9, VOCAB)
    if hidden:
        assert torch.equal(body.hidden, full.hidden)
    else:
        assert body.hidden is None
    assert torch.equal(
        bare.forward(torch.tensor([block])).logits, plain.forward(torch.tensor([block])).logits
    )
