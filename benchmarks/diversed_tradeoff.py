"""Why a learned per-token weight has room (or not) on a pair: the per-token trade-off of drafting.

Along the verifier's own sampled continuations (T = 1) of Spec-Bench training questions, for each token t:
the likelihood cost of drafting it, Δ_t = Σ_y (p_t − q_t)(y) log p_t(y) (what E_{y~π} log p(y) loses per unit
of w_t, linear pool), and its acceptance gain, TV_t = TV(p_t, q_t) (what 1 − TV(q_t, π_t) gains per unit of w_t).
With the ``tv`` regulariser at strength λ and the ``expected_verifier_logp`` reward, the per-token optimum is
w_t = 1 where Δ_t < λ·TV_t and 0 elsewhere; a fixed weight cannot make that choice. The spread of the ratio
Δ_t / TV_t says how much a per-token weight can gain over the static curve: if nearly all tokens share one
ratio, every λ sends (nearly) every token to the same end.

    .venv/bin/python benchmarks/diversed_tradeoff.py --questions 8 --max-new-tokens 40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

DEFAULT_HEAD = ROOT / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagle", default=str(DEFAULT_HEAD))
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    from harness import first_turn_ids, heldout_questions

    from specbench.decoding.cache import CachedModel
    from specbench.decoding.drafting import BatchState, DraftSampler
    from specbench.decoding.schedules import DraftSchedule
    from specbench.decoding.warping import Warping, sample
    from specbench.drafters.base import VerifierView
    from specbench.drafters.eagle3_format import load_eagle3_drafter
    from specbench.evaluation import eos_token_ids, pad_token_id
    from specbench.models import ModelSpec, load_verifier
    from specbench.models.pair import verifier_vocab_size

    torch.set_num_threads(args.threads)
    verifier = load_verifier(ModelSpec(kind="embedded"), "cpu", "float32")
    tokenizer = verifier.tokenizer
    vocab = verifier_vocab_size(verifier.model, tokenizer)
    drafter = load_eagle3_drafter(args.eagle, verifier, vocab)
    ids = [first_turn_ids(tokenizer, q) for q in heldout_questions(3, subset="train")][: args.questions]
    eos = eos_token_ids(verifier.model, tokenizer)
    cached = CachedModel(verifier.model, vocab)
    state = BatchState.create(ids, 1, args.max_new_tokens, eos, pad_token_id(tokenizer, eos), cached.device)
    sampler = DraftSampler(Warping(1.0), torch.Generator().manual_seed(1), DraftSchedule("constant", gamma=1))
    generator = torch.Generator().manual_seed(0)
    cached.reset(state.size)
    drafter.reset(state.size)
    with torch.no_grad():
        out = cached.forward(state.tokens[:, :-1], state.token_valid[:, :-1], output_taps=drafter.needs.taps)
        drafter.prefill(state, VerifierView(state.tokens[:, :-1], state.token_valid[:, :-1], out.hidden, out.taps))
        alive = torch.ones(state.size, dtype=torch.bool)
        costs, gains = [], []
        caps = torch.ones(state.size, dtype=torch.long)
        for _ in range(args.max_new_tokens):
            q = drafter.propose(state, caps, sampler).q[:, 0]
            last = state.last_tokens().unsqueeze(1)
            out = cached.forward(last, torch.ones_like(last, dtype=torch.bool), output_taps=drafter.needs.taps)
            log_p = torch.log_softmax(out.logits[:, 0], -1)
            p = log_p.exp()
            costs.append(((p - q) * log_p.clamp(min=-1e4)).sum(-1)[alive])
            gains.append((0.5 * (p - q).abs().sum(-1))[alive])
            token = sample(p, generator)
            alive = alive & ~state.is_eos(token)
            if not bool(alive.any()):
                break
            state.append([[t] for t in token.tolist()])
            cached.keep(state.lengths() - 1)
            drafter.commit(state, VerifierView(last, torch.ones_like(last, dtype=torch.bool), out.hidden, out.taps),
                           torch.zeros(state.size, dtype=torch.long))  # fmt: skip
    cost, gain = torch.cat(costs), torch.cat(gains)
    ratio = cost / gain.clamp(min=1e-6)
    quantiles = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])
    print(f"{cost.numel()} tokens of {len(ids)} Spec-Bench training questions, verifier samples at T = 1")
    for name, values in (("cost Δ (nats per unit w)", cost), ("gain TV (acceptance per unit w)", gain),
                         ("ratio Δ / TV (the λ at which a token flips)", ratio)):  # fmt: skip
        q = torch.quantile(values, quantiles).tolist()
        print(f"  {name:<45} p10 {q[0]:7.2f}  p25 {q[1]:7.2f}  median {q[2]:7.2f}  p75 {q[3]:7.2f}  p90 {q[4]:7.2f}")
    for lam in (2, 4, 5, 6, 8, 10, 20):
        share = float((ratio < lam).float().mean())
        print(f"  lambda {lam:>3}: the optimum drafts {share:6.1%} of tokens (w_t = 1 where Δ_t < λ·TV_t)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
