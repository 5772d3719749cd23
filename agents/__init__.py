"""Seat policies: the Agent protocol, the registry and the built-in agents.

Importing the package registers the LLM pitch judge and conduct reader (``llm:openai?...``
specs of a scenario's ``judge`` and ``conduct_judge``) with :mod:`market.core.judge_specs`; their
modules load when a scenario first names one."""

from __future__ import annotations

from market.core.conduct.reading import ConductReader
from market.core.judge import Judge
from market.core.judge_specs import register_judge, register_reader


def _llm_judge(spec: str) -> Judge:
    from agents.llm.judge import make_judge

    return make_judge(spec)


def _llm_reader(spec: str) -> ConductReader:
    from agents.llm.conduct_reader import make_conduct_reader

    return make_conduct_reader(spec)


register_judge("llm:", _llm_judge)
register_reader("llm:", _llm_reader)
