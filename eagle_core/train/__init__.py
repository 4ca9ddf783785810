"""Draft-head training: prompts, self-distillation, fixed text, feature capture, training, eval.

Nothing in eagle_core imports this package; run it with `python -m eagle_core.train CONFIG`.
"""
