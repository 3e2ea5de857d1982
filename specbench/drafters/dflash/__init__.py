"""DFlash: a block-diffusion drafter (arXiv 2602.06036; z-lab/dflash). See docs/dflash.md.

``model``: the draft network and its config (parsed from a z-lab ``config.json``); ``checkpoint``: loading
and exporting the z-lab directory layout; ``drafter``: the :class:`~specbench.drafters.base.Drafter`.
"""
