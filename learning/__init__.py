"""Learning layer: the in-process torch policy (embedded default) and, later, training.

Importing this package is cheap: heavy modules (torch, transformers, peft) are imported by the submodules that need them.
"""
