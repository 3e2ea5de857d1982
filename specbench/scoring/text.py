"""Text metrics and answer extraction: ROUGE (rouge-score), BLEU (sacrebleu), GSM8K exact match."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)


def cut_at_stop(text: str, stops: Sequence[str] = ()) -> str:
    """``text`` (leading whitespace dropped) up to the first of ``stops`` (e.g. the next few-shot marker)."""
    text = text.lstrip()
    end = len(text)
    for stop in stops:
        if stop:
            found = text.find(stop)
            if found != -1:
                end = min(end, found)
    return text[:end].strip()


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F1 in points (0–100), Porter stemming, rouge-score's tokenizer."""
    scores = _rouge_scorer().score(reference, prediction)
    return {name: 100.0 * scores[name].fmeasure for name in ROUGE_TYPES}


def sentence_bleu(prediction: str, reference: str) -> float:
    """sacrebleu sentence BLEU (0–100) with its default exponential smoothing."""
    import sacrebleu

    return float(sacrebleu.sentence_bleu(prediction, [reference]).score)


def corpus_bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """sacrebleu corpus BLEU (0–100), one reference per segment, 13a tokenization."""
    import sacrebleu

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        return 0.0
    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def _normalize_number(text: str) -> str | None:
    text = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return None
    if value.is_integer():
        return str(int(value))
    return repr(value)


def gsm8k_target(answer: str) -> str | None:
    """The gold number of a GSM8K ``answer`` field (after ``####``), normalised."""
    if "####" in answer:
        return _normalize_number(answer.split("####")[-1])
    return extract_number(answer)


def extract_number(text: str) -> str | None:
    """The predicted final number: after ``####``, else after "The answer is", else the last number."""
    if "####" in text:
        found = _NUMBER.search(text.split("####", 1)[1])
        if found:
            return _normalize_number(found.group())
    answer_is = _ANSWER_IS.findall(text)
    if answer_is:
        return _normalize_number(answer_is[-1])
    numbers = _NUMBER.findall(text)
    return _normalize_number(numbers[-1]) if numbers else None


def exact_match(prediction: str | None, target: str | None) -> float:
    """1.0 when both numbers are present and equal, else 0.0."""
    return float(prediction is not None and target is not None and prediction == target)
