"""LLM seats: the agent (``agents.llm.agent``), its prompts, backends (OpenAI-compatible,
transformers), the request pool, the response cache and the LLM judge.

Nothing is re-exported here on purpose: importing a backend must not import the agent (and
through it the environment)."""
