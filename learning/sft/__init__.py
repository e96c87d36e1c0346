"""SFT distillation (METHOD §10): teacher trajectories, rejection rules, post-processing and LoRA training."""
