"""Distribution-level test helpers: exact verifier distributions (HF warpers) and a chi-square p-value."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper


def _hf_warp(logits, top_k, top_p):
    procs = LogitsProcessorList()
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return torch.softmax(procs(None, logits.clone()), -1).double()


@torch.no_grad()
def exact_first_tokens(model, prompt, top_k=0, top_p=1.0):
    """Exact P(t1), P(t1, t2) of the verifier sampling at T = 1 (HF warpers as the reference)."""
    logits = model(torch.tensor([prompt])).logits[0, -1].float()
    p1 = _hf_warp(logits[None], top_k, top_p)[0]
    support = (p1 > 0).nonzero().squeeze(1)
    seqs = torch.cat([torch.tensor(prompt).expand(len(support), -1), support[:, None]], dim=1)
    p2 = _hf_warp(model(seqs).logits[:, -1].float(), top_k, top_p)
    joint = torch.zeros(p1.shape[0], p1.shape[0], dtype=torch.float64)
    joint[support] = p1[support, None] * p2
    return p1.numpy(), joint.numpy()


@torch.no_grad()
def exact_next(model, prefix, top_k=0, top_p=1.0):
    return _hf_warp(model(torch.tensor([prefix])).logits[0, -1].float()[None], top_k, top_p)[0].numpy()


def chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    n = counts.sum()
    assert counts[expected_p <= 0].sum() == 0, "a token with probability 0 was generated"
    exp = expected_p * n
    big = exp >= 5
    obs, ex = list(counts[big]), list(exp[big])
    if exp[~big].sum() > 0:
        obs.append(counts[~big].sum())
        ex.append(exp[~big].sum())
    ex = np.array(ex) * (np.sum(obs) / np.sum(ex))
    return float(chisquare(obs, ex).pvalue)
