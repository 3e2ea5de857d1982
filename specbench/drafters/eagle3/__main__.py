"""``python -m specbench.drafters.eagle3 export|compact ...``
(:func:`specbench.drafters.eagle3.format.main`)."""

import sys

from specbench.drafters.eagle3.format import main

sys.exit(main())
