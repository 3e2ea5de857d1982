"""Drafter add-ons: SD² steering (steering.py) and trained-drafter checkpoints (checkpoint.py)."""
