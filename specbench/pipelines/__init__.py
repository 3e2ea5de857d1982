"""Pipelines: the jobs that run the engine (or a serving backend) over a prompt set and write data.

``synthesize``: ``task=synth``'s sampling loop with resume (methods.md §6), planned by ``synth_plan``
(settings, batches, the identity a resumed run must match); the rows and saved datasets it
writes are described in :mod:`specbench.data.synth_rows` and :mod:`specbench.data.synth_dataset`.
"""
