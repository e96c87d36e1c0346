"""Learning layer: the in-process torch policy (the embedded default), SFT, SS-GRPO with the reflection meta-policy,
DeepRubric pairs, the judges, the retraining pipeline and evaluation.

Importing this package is cheap: heavy modules (torch, transformers, peft) are imported by the submodules that need them.
"""
