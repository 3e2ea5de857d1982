"""Measured results kept as data: one validated JSON record per benchmark run under ``results/``, and the
tables of the README and ``docs/results.md`` rendered from them (``python -m specbench.results``).

Torch-free and free of the rest of specbench, so any script can write a record and any test can read them.
"""

from specbench.results.record import (
    RECORD_SCHEMA,
    ResultRecordError,
    bootstrap_interval,
    load_record,
    load_records,
    make_record,
    validate_record,
    write_record,
)
from specbench.results.run import add_record_options, record_run

__all__ = [
    "RECORD_SCHEMA",
    "ResultRecordError",
    "add_record_options",
    "bootstrap_interval",
    "load_record",
    "load_records",
    "make_record",
    "record_run",
    "validate_record",
    "write_record",
]
