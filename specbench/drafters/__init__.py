"""Drafters: what proposes the tokens the verifier checks, each a
:class:`~specbench.decoding.protocol.Drafter` (re-exported for drafter authors by ``base.py``) named by a
``model/drafter`` yaml.

Model-free: ``prompt_lookup.py``, ``ngram.py``, ``suffix.py`` (its tree in ``suffix_tree.py``, seeded from
``task=synth`` responses by ``suffix_seed.py``), ``fallback.py`` (one drafter, else another) over
``token_history.py``. SD²: ``steering.py`` (the steering head) and ``sd2.py`` (the steered drafter);
``trained.py`` loads trained drafter / steering checkpoints. EAGLE-3: the ``eagle3/`` package (``head.py``,
``drafter.py``, ``format.py``: public checkpoints and the yaml's factory, ``checkpoint.py``: specbench's own);
``eagle3_format.py`` is its old module path. DFlash: the ``dflash/`` package. A plain causal LM drafts through
:mod:`specbench.decoding.model_drafter`; building a drafter for a verifier is :mod:`specbench.pairs`.
"""
