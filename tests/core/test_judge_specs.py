"""A scenario's ``judge`` and ``conduct_judge`` specs resolved by the core's registry
(:mod:`market.core.judge_specs`): ``rule`` built by the core, other kinds by the factory their
room registered, and the environment importing nothing of ``agents`` to build either."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT

from market.core import judge_specs
from market.core.conduct.reading import RuleReader
from market.core.judge import RuleJudge


def test_rule_specs_are_the_cores_own_judge_and_reader() -> None:
    assert type(judge_specs.make_judge("rule")) is RuleJudge
    assert type(judge_specs.make_reader("rule")) is RuleReader


@pytest.mark.parametrize("spec", ["", "   ", "magic", "magic?x=1", "rules"])
def test_an_unknown_kind_is_refused_with_what_is_known(spec: str) -> None:
    for build in (judge_specs.make_judge, judge_specs.make_reader):
        with pytest.raises(judge_specs.UnknownJudgeError) as err:
            build(spec)
        message = str(err.value)
        assert "'rule'" in message
        if spec.strip():
            assert repr(spec.partition("?")[0]) in message and "llm:" in message


def test_a_registered_factory_builds_its_kind_and_a_colon_prefix_covers_its_kinds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(judge_specs, "_JUDGES", dict(judge_specs._JUDGES))
    seen: list[str] = []

    class Marker(RuleJudge):
        pass

    def factory(spec: str) -> RuleJudge:
        seen.append(spec)
        return Marker()

    judge_specs.register_judge("test:", factory)
    judge_specs.register_judge("exact", factory)
    assert isinstance(judge_specs.make_judge("test:one?a=1"), Marker)
    assert isinstance(judge_specs.make_judge("exact?b=2"), Marker)
    assert seen == ["test:one?a=1", "exact?b=2"]
    with pytest.raises(judge_specs.UnknownJudgeError):
        judge_specs.make_judge("exactly")  # a prefix without ':' names one kind only
    with pytest.raises(ValueError, match="prefix"):
        judge_specs.register_judge("rule", factory)
    with pytest.raises(ValueError, match="prefix"):
        judge_specs.register_judge("x?y", factory)


PROBE = """
import json, sys
import market.environment.aec as aec
from market.core import judge_specs
env_loaded = sorted(m for m in sys.modules if m == "agents" or m.startswith("agents."))
judge = judge_specs.make_judge("llm:openai?model=m&base_url=http://127.0.0.1:9/v1")
reader = judge_specs.make_reader("llm:openai?model=m&base_url=http://127.0.0.1:9/v1")
print(json.dumps({"env_loaded": env_loaded, "judge": type(judge).__name__,
                  "reader": type(reader).__name__, "module": type(judge).__module__}))
"""


def test_the_env_loads_no_agents_and_an_llm_spec_still_builds_in_a_bare_script() -> None:
    """The environment imports nothing of ``agents``; a script that never imported ``agents``
    still gets the LLM judge and reader, through the registry's one import of its plug-in
    packages (fresh interpreter: nothing imported before)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["env_loaded"] == []
    assert probe["judge"] == "LLMJudge" and probe["module"] == "agents.llm.judge"
    assert probe["reader"] == "LLMConductReader"
