"""``python -m specbench.results render|check|list``: write the README's and docs/results.md's tables from
the records under results/, check that the committed tables are current, or list the latest rows."""

from __future__ import annotations

import argparse
import sys

from specbench.results.record import ResultRecordError, latest_rows, load_records
from specbench.results.render import ROOT, rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specbench.results", description=__doc__)
    parser.add_argument("action", choices=("render", "check", "list"))
    args = parser.parse_args(argv)
    try:
        pages = rendered()
        records = load_records()
    except (ResultRecordError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.action == "list":
        for path, record, row in latest_rows(records):
            print(f"{record['benchmark']:<16} {row['setup']:<48} {path.relative_to(ROOT)}")
        return 0
    stale = [path for path, text in pages.items() if path.read_text(encoding="utf-8") != text]
    if args.action == "check":
        for path in stale:
            print(
                f"{path.relative_to(ROOT)} is out of date: run python -m specbench.results render",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in stale:
        path.write_text(pages[path], encoding="utf-8")
        print(f"rendered {path.relative_to(ROOT)}")
    print(f"{len(records)} records, {len(latest_rows(records))} setups; {len(stale)} page(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
