"""The results table an eval run prints: one row per decoding, labelled by what sets it apart."""

from __future__ import annotations

from typing import Any

from specbench.method_names import quiet_value, table_labels

# metrics.json keys (``method_<param>`` from the rule) shown in the method's label, in the method table's
# order; checkpoints are shown as ``trained=<file>`` instead.
LABEL_PARAMS = table_labels(paths=False)


def format_value(value: Any) -> str:
    """A parameter as people write it: 0.3, not 0.30000000000000004; 1e-05 stays short."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def method_label(metrics: dict) -> str:
    """``static_ensemble w=0.3 (constant, gamma=3)``: the method, the parameters it reads, its schedule."""
    method = metrics["method"]
    if method == "auto":
        return method
    params = []
    for key, short in LABEL_PARAMS:
        value = metrics.get(f"method_{key}")
        if value is None or value == quiet_value(key):
            continue
        params.append(f"{short}={format_value(value)}")
    if metrics.get("method_checkpoint"):
        checkpoint = str(metrics["method_checkpoint"])
        trained = f"trained={checkpoint.rsplit('/', 1)[-1]}"
        params.append("untrained" if checkpoint.startswith("none") else trained)
    head = " ".join([method, *params])
    return f"{head} ({metrics['schedule']}, gamma={metrics['gamma']})"


def format_table(metrics: dict) -> str:
    """The method row and, when the baseline ran, the autoregressive row; columns fit the longest label."""
    label = method_label(metrics)
    rows_data = [
        (
            label,
            f"{metrics['tau']:.2f}",
            f"{metrics['acceptance_rate']:.3f}" if metrics["method"] != "auto" else "-",
            f"{metrics['tokens_per_s']:.1f}",
            f"{metrics['speedup']:.2f}x" if "speedup" in metrics else "-",
        )
    ]
    if "baseline_new_tokens" in metrics:
        rows_data.append(("autoregressive", "1.00", "-", f"{metrics['baseline_tokens_per_s']:.1f}", "1.00x"))
    width = max(len("method"), *(len(row[0]) for row in rows_data))
    widths = (width, 6, 11, 10, 8)

    def line(cells: tuple[str, ...]) -> str:
        first, *rest = cells
        return " ".join([f"{first:<{widths[0]}}", *(f"{c:>{w}}" for c, w in zip(rest, widths[1:]))])

    header = line(("method", "tau", "acceptance", "tokens/s", "speedup"))
    rows = [header, "-" * len(header), *(line(row) for row in rows_data), "-" * len(header)]
    quality = [
        f"{k.removeprefix('quality_')} {v:.3g}" for k, v in metrics.items() if _is_quality_number(k, v)
    ]
    if quality:
        rows.append("quality: " + ", ".join(quality))
    rows.append(
        f"verifier {metrics['verifier']} | drafter {metrics['drafter']} | {metrics['num_samples']} prompts "
        f"({metrics['prompt_format']}), {metrics['new_tokens']} new tokens in {metrics['wall_time_s']:.2f} s"
        + (f" on {metrics['device']} in {metrics['dtype']}" if "dtype" in metrics else "")
        + (
            f" (+ baseline {metrics['baseline_wall_time_s']:.2f} s)"
            if "baseline_wall_time_s" in metrics
            else ""
        )
    )
    if "baseline_match_rate" in metrics and metrics["method"] != "auto":  # greedy runs only
        rate = metrics["baseline_match_rate"]
        rows.append(f"outputs identical to autoregressive decoding: {rate:.0%} of prompts"
                    + ("" if rate == 1.0 else " (a lossless method must give 100 %; lossy rules need not)"))
    if metrics.get("untrained"):
        rows.append(f"note: {metrics['untrained']}")
    return "\n".join(rows)


def _is_quality_number(key: str, value: Any) -> bool:
    return key.startswith("quality_") and key != "quality_num_scored" and isinstance(value, (int, float))
