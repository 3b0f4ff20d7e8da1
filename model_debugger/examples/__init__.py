"""Bundled example training scripts (``make demo`` diagnoses ``broken_training.py``)."""
