"""Lightning training: the shared Trainer (trainer.py), drafter distillation / SD² (drafter.py), the DIVERSED head (diversed.py)."""
