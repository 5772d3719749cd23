"""Model backends for LLM seats: an OpenAI-compatible HTTP client and in-process transformers."""
