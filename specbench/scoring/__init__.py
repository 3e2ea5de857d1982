"""Task quality: ROUGE, BLEU, GSM8K exact match, pass@1 with sandboxed execution (methods.md §5, §7).

Importing this package runs nothing and starts no process.
"""

from specbench.scoring.code import check_program, fenced_code, humaneval_program, mbpp_program
from specbench.scoring.quality import (
    METRICS,
    SPEC_BENCH_SCORED,
    Quality,
    ScoringOptions,
    sample_rewards,
    score_run,
    score_samples,
)
from specbench.scoring.sandbox import (
    ISOLATIONS,
    ExecutionResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
    run_python,
)
from specbench.scoring.text import (
    corpus_bleu,
    cut_at_stop,
    exact_match,
    extract_number,
    gsm8k_target,
    rouge,
    sentence_bleu,
)

__all__ = [
    "ISOLATIONS",
    "METRICS",
    "SPEC_BENCH_SCORED",
    "ExecutionResult",
    "Quality",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailableError",
    "ScoringOptions",
    "check_program",
    "corpus_bleu",
    "cut_at_stop",
    "exact_match",
    "extract_number",
    "fenced_code",
    "gsm8k_target",
    "humaneval_program",
    "mbpp_program",
    "rouge",
    "run_python",
    "sample_rewards",
    "score_run",
    "score_samples",
    "sentence_bleu",
]
