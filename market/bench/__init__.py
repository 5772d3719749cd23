"""Benchmarks (``gpumarket bench``) and the fake OpenAI-compatible server they use (a test
double, not a model)."""
