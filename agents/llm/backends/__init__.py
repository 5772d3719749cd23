"""Chat-completion backends of LLM seats: OpenAI-compatible servers and local transformers."""
