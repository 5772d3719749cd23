"""The FakeOpenAIServer test double now ships in the package (``market.fake_openai_server``), so
that ``python -m market.llm_bench --spawn-fake`` works from an installed wheel; this module keeps
``from fake_openai_server import ...`` working in tests."""

from market.fake_openai_server import FakeOpenAIServer, Recorded, Reply, default_policy

__all__ = ["FakeOpenAIServer", "Recorded", "Reply", "default_policy"]
