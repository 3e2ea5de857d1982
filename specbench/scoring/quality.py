"""Task quality of a run (methods.md §7): one entry point for every metric, and samples.jsonl annotation."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.scoring import text as textm
from specbench.scoring.code import check_program, run_programs
from specbench.scoring.sandbox import Sandbox, SandboxLimits

METRICS = ("none", "rouge", "bleu", "exact_match", "pass@1", "spec_bench")
# Spec-Bench categories that carry a reference, and the metric each is scored with.
SPEC_BENCH_SCORED = {"translation": "bleu", "math_reasoning": "exact_match"}


@dataclass
class ScoringOptions:
    """How code is executed for pass@1 (see :mod:`specbench.scoring.sandbox`)."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    workers: int = 1
    isolation: str = "auto"

    @classmethod
    def from_config(cls, node: Any) -> ScoringOptions:
        """From the ``scoring`` config node (its ``enabled`` flag is the caller's business)."""
        return cls(float(node.timeout_s), int(node.memory_mb), int(node.workers), str(node.isolation))


@dataclass
class Quality:
    """Flat ``quality_*`` metrics, and per sample the primary score (None: not scored) and details."""

    metrics: dict[str, Any]
    scores: list[float | None]
    details: list[dict[str, Any]] = field(default_factory=list)


def _reference_text(reference: Any) -> str | None:
    if reference is None:
        return None
    if isinstance(reference, (list, tuple)):
        return str(reference[0]) if reference else None
    return str(reference)


def _score_rouge(outputs: Sequence[str], references: Sequence[str]) -> Quality:
    per = [textm.rouge(o, r) for o, r in zip(outputs, references)]
    metrics = {f"quality_{name}": _mean([p[name] for p in per]) for name in textm.ROUGE_TYPES}
    return Quality(metrics, [p["rouge2"] for p in per], per)


def _score_bleu(outputs: Sequence[str], references: Sequence[str]) -> Quality:
    scores = [textm.sentence_bleu(o, r) for o, r in zip(outputs, references)]
    metrics = {"quality_bleu": textm.corpus_bleu(outputs, references)}
    return Quality(metrics, scores, [{"sentence_bleu": s} for s in scores])


def _score_exact_match(outputs: Sequence[str], references: Sequence[str]) -> Quality:
    details, scores = [], []
    for output, reference in zip(outputs, references):
        predicted, target = textm.extract_number(output), textm.gsm8k_target(reference)
        scores.append(textm.exact_match(predicted, target))
        details.append({"prediction": predicted, "target": target})
    return Quality({"quality_exact_match": _mean(scores)}, scores, details)


def _score_code(outputs: Sequence[str], metas: Sequence[dict], options: ScoringOptions) -> Quality:
    sandbox = Sandbox(
        SandboxLimits(timeout_s=options.timeout_s, memory_mb=options.memory_mb), options.isolation
    )
    programs = [check_program(meta, output) for meta, output in zip(metas, outputs)]
    results = run_programs(programs, sandbox, options.workers)
    scores = [float(r.passed) for r in results]
    details = [{"status": r.status, "message": r.message} for r in results]
    metrics = {
        "quality_pass@1": _mean(scores),
        "quality_code_timeouts": sum(r.status == "timeout" for r in results),
        "quality_sandbox": sandbox.isolation,
    }
    return Quality(metrics, scores, details)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def score_samples(
    metric: str,
    outputs: Sequence[str],
    references: Sequence[Any],
    metas: Sequence[dict] | None = None,
    categories: Sequence[str | None] | None = None,
    stops: Sequence[str] = (),
    options: ScoringOptions | None = None,
) -> Quality:
    """Score decoded ``outputs`` against ``references`` with ``metric`` (one of :data:`METRICS`).

    Outputs are first cut at ``stops`` (the dataset's few-shot / completion markers; pass () for chat
    outputs). ``metas`` carry what code metrics need (tests, entry point); ``categories`` the Spec-Bench
    categories. ROUGE and BLEU are in points (0–100), exact match and pass@1 fractions (0–1). Samples
    without a reference are not scored (score None).
    """
    if metric not in METRICS:
        raise ValueError(f"dataset.metric: unknown metric {metric!r}; allowed: {list(METRICS)}")
    n = len(outputs)
    if len(references) != n:
        raise ValueError(f"{n} outputs but {len(references)} references")
    metas = list(metas) if metas is not None else [{} for _ in range(n)]
    options = options or ScoringOptions()
    if metric == "none":
        return Quality({}, [None] * n, [{} for _ in range(n)])
    if metric == "spec_bench":
        return _score_spec_bench(outputs, references, categories or [None] * n, stops)
    if metric == "pass@1":
        quality = _score_code(outputs, metas, options)  # code extraction has its own stops
    else:
        cut = [textm.cut_at_stop(o, stops) for o in outputs]
        chosen = [i for i in range(n) if _reference_text(references[i]) is not None]
        refs = [_reference_text(references[i]) for i in chosen]
        picked = [cut[i] for i in chosen]
        scorer = {"rouge": _score_rouge, "bleu": _score_bleu, "exact_match": _score_exact_match}[metric]
        partial = scorer(picked, refs)
        quality = Quality(partial.metrics, [None] * n, [{} for _ in range(n)])
        for position, index in enumerate(chosen):
            quality.scores[index] = partial.scores[position]
            quality.details[index] = partial.details[position]
    quality.metrics = {"quality_metric": metric, **quality.metrics}
    quality.metrics["quality_num_scored"] = sum(s is not None for s in quality.scores)
    return quality


def sample_rewards(
    metric: str,
    outputs: Sequence[str],
    references: Sequence[Any],
    metas: Sequence[dict] | None = None,
    stops: Sequence[str] = (),
    options: ScoringOptions | None = None,
) -> list[float]:
    """Per-sample rewards in [0, 1] (methods.md §5): ROUGE-2 F1 (rouge), sentence BLEU / 100 (bleu),
    exact match (exact_match), pass/fail of the sandboxed tests (pass@1); 0 without a reference."""
    if metric not in ("rouge", "bleu", "exact_match", "pass@1"):
        raise ValueError(f"no per-sample reward for metric {metric!r}")
    quality = score_samples(metric, outputs, references, metas=metas, stops=stops, options=options)
    scale = 100.0 if metric in ("rouge", "bleu") else 1.0
    return [0.0 if score is None else score / scale for score in quality.scores]


def _score_spec_bench(
    outputs: Sequence[str], references: Sequence[Any], categories: Sequence[str | None], stops: Sequence[str]
) -> Quality:
    """BLEU on translation and exact match on math_reasoning (the categories with references)."""
    n = len(outputs)
    quality = Quality({"quality_metric": "spec_bench"}, [None] * n, [{} for _ in range(n)])
    for category, metric in SPEC_BENCH_SCORED.items():
        chosen = [i for i in range(n) if categories[i] == category and _reference_text(references[i])]
        if not chosen:
            continue
        part = score_samples(
            metric, [outputs[i] for i in chosen], [references[i] for i in chosen], stops=stops
        )
        for key, value in part.metrics.items():
            if key not in ("quality_metric", "quality_num_scored"):
                quality.metrics[key.replace("quality_", f"quality_{category}_", 1)] = value
        for position, index in enumerate(chosen):
            quality.scores[index] = part.scores[position]
            quality.details[index] = {"metric": metric, **part.details[position]}
    quality.metrics["quality_num_scored"] = sum(s is not None for s in quality.scores)
    return quality


def score_run(
    samples_path: str | Path,
    prompts: Sequence[Any],
    metric: str,
    stops: Sequence[str] = (),
    options: ScoringOptions | None = None,
) -> dict[str, Any]:
    """Score a finished run's ``samples.jsonl`` and add ``reference``, ``score``, ``score_details`` to it.

    ``prompts`` is the whole prompt set (objects with ``id``, ``reference``, ``category``, ``meta``); a
    row is matched to its prompt by its ``index`` (position in the set), else by position, and its
    ``id`` is checked. The file may hold a shard or a resumed run. It is rewritten atomically. Returns
    the flat ``quality_*`` metrics of the rows in the file.
    """
    if metric == "none":
        return {}
    path = Path(samples_path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    matched = []
    for number, row in enumerate(rows, start=1):
        index = row.get("index", number - 1)
        if not isinstance(index, int) or not 0 <= index < len(prompts) or prompts[index].id != row.get("id"):
            raise ValueError(f"{path}:{number}: sample {row.get('id')!r} does not match the prompt set")
        matched.append(prompts[index])
    quality = score_samples(
        metric,
        [row.get("output_text", "") for row in rows],
        [p.reference for p in matched],
        metas=[p.meta for p in matched],
        categories=[p.category for p in matched],
        stops=stops,
        options=options,
    )
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row, prompt, score, details in zip(rows, matched, quality.scores, quality.details):
            if prompt.reference is not None:
                row["reference"] = prompt.reference
            row["score"] = score
            if details:
                row["score_details"] = details
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return quality.metrics
