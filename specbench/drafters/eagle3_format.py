"""The old module path of :mod:`specbench.drafters.eagle3.format`, for configs whose ``target:`` still reads
``specbench.drafters.eagle3_format.eagle3_drafter`` and for ``python -m specbench.drafters.eagle3_format``.
New code imports :mod:`specbench.drafters.eagle3` (the CLI: ``python -m specbench.drafters.eagle3``)."""

import sys

from specbench.drafters.eagle3.format import *  # every public name of the new module
from specbench.drafters.eagle3.format import main, resolve_head_path  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
