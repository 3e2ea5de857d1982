"""Training the trained parts of the methods, with Lightning: the shared Trainer and checkpoints (trainer.py),
drafter distillation / SD² (drafter.py), the EAGLE-3 head (eagle3.py) and the DIVERSED head (diversed.py,
with its rollout, objective, rewards and prompt data). They share the batches of ``task=synth`` rows
(batches.py: padding, the verifier's taps and targets; synth_data.py: the data module) and the
verifier-feature disk cache (features.py)."""
