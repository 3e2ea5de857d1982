"""What a synth shard already has when it starts: the rows of its rows file or of its finished archive
(:mod:`specbench.data.synth_archive`), checked against this run, or, with ``synth.resume=false``, nothing (the
old files are kept aside, never deleted)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from specbench.data.synth_archive import archive_metadata_path, archive_path
from specbench.data.synth_rows import SynthDataError, _iter_rows, _Packed, rows_path, settings_path
from specbench.pipelines.synth_plan import SynthSettings, _set_aside, check_resumable, job_id


def prior_rows(
    out: Path, settings: SynthSettings, identity: dict[str, Any], encoded: dict[int, list[int]], jobs: dict,
    resume: bool,
) -> dict[int, _Packed]:
    """The rows this shard already has in ``out``, by job id (:func:`job_id`)."""
    rows_file = rows_path(out, settings.shard_id, settings.num_shards)
    record_file = settings_path(out, settings.shard_id, settings.num_shards)
    archive = archive_path(out, settings.shard_id, settings.num_shards)
    responses = settings.responses_per_prompt
    if resume and archive.exists():
        check_resumable(out, settings, identity)
        return _archived_rows(archive, rows_file, encoded, jobs, responses, settings.target_len)
    if resume and rows_file.exists():
        check_resumable(out, settings, identity)
        return _resumed_rows(rows_file, encoded, responses, settings.target_len)
    for moved in _set_aside([rows_file, record_file, archive, archive_metadata_path(archive)]):
        print(f"synth.resume=false: kept the earlier file as {moved}", file=sys.stderr)
    return {}  # fmt: skip


def _archived_rows(
    archive: Path, rows_file: Path, encoded: dict[int, list[int]], jobs: dict, responses: int, target_len: int
) -> dict[int, _Packed]:
    """The rows of a finished shard's archive, by job id; SynthDataError if this run has more jobs. A rows
    file left beside it (a run stopped between writing the archive and removing the file) is set aside."""
    if rows_file.exists():
        for moved in _set_aside([rows_file]):
            print(f"{archive.name} is complete: kept the leftover rows file as {moved}", file=sys.stderr)
    done = _resumed_rows(archive, encoded, responses, target_len)
    missing = len(set(jobs) - set(done))
    if missing:
        raise SynthDataError(
            f"{archive}: the archive of this finished shard lacks {missing} of this run's prompts; sample "
            "them into another synth.output_dir, or pass synth.resume=false to start the shard over (the "
            "archive is kept aside)"
        )
    return done


def _resumed_rows(
    rows_file: Path, encoded: dict[int, list[int]], responses: int, target_len: int
) -> dict[int, _Packed]:
    """The rows already in ``rows_file``, by job id; SynthDataError for one this run would not write."""
    done: dict[int, _Packed] = {}
    for number, row in _iter_rows(rows_file, repair=True, target_len=target_len):
        index, response = row["source_index"], int(row.get("response_index", 0))
        job = job_id(index, response, responses)
        problem = None
        if job in done:
            problem = "is a duplicate"
        elif index not in encoded or response >= responses:
            problem = "is not a prompt of this shard"
        elif row["input_ids"][: row["prompt_len"]] != encoded[index]:
            problem = "has another prompt than this run encodes"
        if problem:
            raise SynthDataError(
                f"{rows_file}:{number}: the row of source_index {index} (response {response}) {problem}; "
                "pass "
                "synth.resume=false to start over (the old rows are kept aside) or choose another "
                "synth.output_dir"
            )
        done[job] = _Packed.of(row)
    return done
