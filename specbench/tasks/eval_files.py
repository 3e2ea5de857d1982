"""The files of an eval run's output dir: samples.jsonl, appended as rows finish and read back (repaired) on
resume, and the check that a resumed run has the config it started with."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from omegaconf import OmegaConf

from specbench.data.prompts import Prompt
from specbench.errors import ConfigError
from specbench.tracking.naming import flatten, may_change_on_rerun

if TYPE_CHECKING:
    from specbench.decoding.engine import SampleResult

METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.jsonl"


class SampleWriter:
    """Appends one JSON line per sample to ``samples.jsonl`` and flushes after every batch.

    ``dataset_indices[i]`` is the position of ``prompts[i]`` in the whole prompt set (saved as ``index``;
    default: ``i``). Rows carry what :func:`specbench.evaluation.summarize_samples` needs to recompute
    the summary, and are kept in ``rows``.
    """

    def __init__(
        self,
        handle: IO[str],
        prompts: list[Prompt],
        tokenizer: Any,
        dataset_indices: list[int] | None = None,
    ) -> None:
        self.handle = handle
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.dataset_indices = dataset_indices
        self.rows: list[dict] = []

    def __call__(
        self, indices: list[int], results: list[SampleResult], baseline: list[SampleResult] | None
    ) -> None:
        from specbench.evaluation import saved_timing

        for position, (index, result) in enumerate(zip(indices, results)):
            prompt = self.prompts[index]
            row = {
                "id": prompt.id,
                "index": self.dataset_indices[index] if self.dataset_indices is not None else index,
                "category": prompt.category,
                "prompt": prompt.text,
                "output_ids": result.output_ids,
                "output_text": self.tokenizer.decode(result.output_ids, skip_special_tokens=True),
                "rounds": [[r.drafted, r.accepted] for r in result.rounds],
                "tokens_per_s": result.tokens_per_s,
                "finished_by_eos": result.finished_by_eos,
            }
            if prompt.reference is not None:
                row["reference"] = prompt.reference
            drafted_weights = [w for r in result.rounds for w in (r.draft_weights or ())]
            if drafted_weights:  # learned ensembles: mean draft weight over the sample's drafted tokens
                row["mean_draft_weight"] = sum(drafted_weights) / len(drafted_weights)
            if baseline is not None:
                row["baseline_tokens_per_s"] = baseline[position].tokens_per_s
                row["matches_baseline"] = baseline[position].output_ids == result.output_ids
                row["baseline_new_tokens"] = len(baseline[position].output_ids)
                row["baseline_wall_time_s"] = baseline[position].wall_time
            row.update(saved_timing(result, batch_rows=len(indices)))
            self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.rows.append(row)
        self.handle.flush()


def check_same_config(saved: Path, cfg: Any) -> None:
    """Raise ConfigError unless ``saved`` (an earlier run's config.yaml) matches ``cfg`` (but for the keys
    that :data:`specbench.tracking.naming.RERUN_MAY_CHANGE` lists)."""
    if not saved.is_file():
        raise ConfigError(
            f"eval.output_dir: {saved.parent} has {SAMPLES_FILE} but no {CONFIG_FILE}, so it cannot be "
            "resumed; pass eval.resume=false to overwrite it or choose another eval.output_dir"
        )

    def relevant(tree: Any) -> dict:
        return {k: v for k, v in flatten(tree).items() if not may_change_on_rerun(k)}

    before = relevant(OmegaConf.to_container(OmegaConf.load(saved), resolve=True))
    now = relevant(OmegaConf.to_container(cfg, resolve=True))
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if changed:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:4])
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise ConfigError(
            f"eval.output_dir: {saved.parent} holds samples of another config ({shown}{more}); pass "
            "eval.resume=false to overwrite them or choose another eval.output_dir"
        )


def read_samples(path: Path, repair: bool = False) -> list[dict]:
    """The complete lines of a samples.jsonl.

    A last line without its newline is a torn write of a killed job: it is dropped (and, with
    ``repair``, cut from the file so appends start on a clean line). Complete lines are never dropped;
    a complete line that is not JSON raises ConfigError naming it.
    """
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    rows = []
    for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ConfigError(f"eval.output_dir: {path}:{number} is not valid JSON ({err.msg})") from err
    if end < len(data):
        print(f"warning: dropped a torn last line ({len(data) - end} bytes) of {path}", file=sys.stderr)
        if repair:
            with open(path, "r+b") as handle:
                handle.truncate(end)
    return rows


def sample_key_function(prompts: list[Prompt]) -> Any:
    """Samples are matched to prompts by ``id``, or by ``index`` when the ids are not unique."""
    ids = [json.dumps(p.id) for p in prompts]
    if len(set(ids)) == len(ids):
        return lambda row: json.dumps(row["id"])
    return lambda row: row["index"]
