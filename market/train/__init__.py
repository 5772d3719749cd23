"""Training: the torch policy-gradient trainer and LLM training data (SFT export, GRPO)."""
