"""The scenario schema: everything an episode is drawn from, validated by pydantic.

Ranges are written ``[low, high]`` and drawn uniformly (integers for counts) from the world RNG
stream at reset. Every key is documented in ``docs/scenarios.md``.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from market.core.mechanisms import Mechanism

ShockKind = Literal[
    "capacity_outage",
    "reliability_drop",
    "demand_surge",
    "budget_cut",
    "windfall",
    "energy_spike",
    "lab_exit",
    "lab_entry",
]
SHOCK_KINDS: tuple[ShockKind, ...] = get_args(ShockKind)
#: the designer composite's weighted components (rewards adds revenue and the composite itself)
DesignerWeight = Literal["welfare_ratio", "fairness", "participation", "stability"]
DESIGNER_WEIGHTS: tuple[DesignerWeight, ...] = get_args(DesignerWeight)
#: the judge pool's judges, as a scenario's ``judge`` spec names them: ``"rule"`` exactly, or
#: ``"llm:openai?key=value&..."`` (built by ``agents.llm.judge.make_judge``)
JudgeKind = Literal["rule", "llm:openai"]
JUDGE_KINDS: tuple[JudgeKind, ...] = get_args(JudgeKind)


#: Scenario keys that say how episodes are run, not what they are: a run folder's or tournament's
#: configuration hash and the replay's check for a changed built-in leave them out, so a run can
#: be resumed, and a transcript replayed, under another limit
RUN_ONLY_KEYS = frozenset({"agent_timeout"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_range(value: tuple[float, float], name: str) -> None:
    if value[0] > value[1]:
        raise ValueError(f"{name}: low {value[0]} is above high {value[1]}; write [low, high]")


class LabsSpec(_Strict):
    count: int = Field(3, ge=1, le=5000, description="Labs present at the start.")
    entrants: int = Field(
        0, ge=0, le=1000, description="Extra bidder seats that can enter through lab_entry shocks."
    )
    budget: tuple[float, float] = Field((200.0, 400.0), description="Initial credits per lab.")
    reputation: tuple[float, float] = Field((0.5, 0.9), description="Initial reputation in [0, 1].")
    jobs: tuple[int, int] = Field((1, 3), description="Jobs each lab holds at the start.")
    endowment: tuple[int, int] = Field(
        (0, 2),
        description="Blocks a lab owns in each of its first endowment_rounds rounds (its contracts).",
    )
    endowment_rounds: int = Field(
        2, ge=0, description="How many leading rounds the endowment covers."
    )

    @model_validator(mode="after")
    def _ranges(self) -> LabsSpec:
        for name in ("budget", "reputation", "jobs", "endowment"):
            _check_range(getattr(self, name), f"labs.{name}")
        if not (self.reputation[0] >= 0.0 and self.reputation[1] <= 1.0):
            raise ValueError("labs.reputation must lie within [0, 1]")
        if self.budget[0] < 0 or self.jobs[0] < 0 or self.endowment[0] < 0:
            raise ValueError("labs.budget, labs.jobs and labs.endowment must be non-negative")
        return self


class JobsSpec(_Strict):
    size: tuple[int, int] = Field((2, 6), description="GPU-block-rounds of progress a job needs.")
    value_per_block: tuple[float, float] = Field(
        (15.0, 45.0), description="Private value per block of size; value = size x this."
    )
    slack: tuple[int, int] = Field(
        (1, 3),
        description="Deadline = arrival + this many rounds (inclusive), clipped to the horizon.",
    )
    partial_credit_prob: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Chance a job pays value x progress/size at its deadline if unfinished.",
    )
    min_reliability: tuple[float, float] = Field(
        (0.0, 0.9), description="Blocks below this reliability cannot run the job."
    )
    arrival_rate: float = Field(
        0.2, ge=0.0, le=20.0, description="Mean new jobs per lab per round after round 0 (Poisson)."
    )

    @model_validator(mode="after")
    def _ranges(self) -> JobsSpec:
        for name in ("size", "value_per_block", "slack", "min_reliability"):
            _check_range(getattr(self, name), f"jobs.{name}")
        if self.size[0] < 1:
            raise ValueError("jobs.size must be at least 1")
        if self.slack[0] < 0:
            raise ValueError("jobs.slack must be non-negative")
        if not (self.min_reliability[0] >= 0.0 and self.min_reliability[1] <= 1.0):
            raise ValueError("jobs.min_reliability must lie within [0, 1]")
        return self


class CapacitySpec(_Strict):
    blocks: tuple[int, int] = Field((6, 8), description="Blocks the operator releases each round.")
    reliability: float = Field(
        0.95, ge=0.0, le=1.0, description="Probability a used block adds progress."
    )
    max_units_per_bid: int = Field(
        0, ge=0, description="Most unit bids in one schedule (0 = the round's capacity)."
    )

    @model_validator(mode="after")
    def _ranges(self) -> CapacitySpec:
        _check_range(self.blocks, "capacity.blocks")
        if self.blocks[0] < 0:
            raise ValueError("capacity.blocks must be non-negative")
        return self


class ShockSpec(_Strict):
    """A scheduled shock. ``round`` is when it starts; ``target`` a lab index (None: drawn)."""

    kind: ShockKind
    round: int = Field(ge=0)
    duration: int = Field(1, ge=1)
    magnitude: float | None = Field(
        None,
        ge=0.0,
        description="Meaning per kind: outage/reliability_drop/budget_cut = fraction; windfall/energy_spike = credits; demand_surge = value multiplier of the urgent job. Default: the middle of the kind's random range (see market/core/shocks.py).",
    )
    target: int | None = Field(None, ge=0)
    public: bool = True


class ShockRates(_Strict):
    """Per-round probabilities of random shocks (drawn at reset from the shock stream)."""

    capacity_outage: float = Field(0.0, ge=0.0, le=1.0)
    reliability_drop: float = Field(0.0, ge=0.0, le=1.0)
    demand_surge: float = Field(0.0, ge=0.0, le=1.0)
    budget_cut: float = Field(0.0, ge=0.0, le=1.0)
    windfall: float = Field(0.0, ge=0.0, le=1.0)
    energy_spike: float = Field(0.0, ge=0.0, le=1.0)
    lab_exit: float = Field(0.0, ge=0.0, le=1.0)
    lab_entry: float = Field(0.0, ge=0.0, le=1.0)
    public_share: float = Field(
        0.5, ge=0.0, le=1.0, description="Chance a random shock is announced publicly."
    )


class DeliverySpec(_Strict):
    """Delivery risk (docs/world.md, Delivery risk): owned blocks that fail, short forward sales
    and their collateral.

    At the close of round ``r``, after the auction and before forward contracts are delivered,
    every block a lab holds for ``r`` fails independently with probability
    ``p_r = min(1, owned_failure_rate + outage_exposure x outage_r + reliability_exposure x
    drop_r)``, where ``outage_r`` is the share of round ``r``'s base capacity that outages took
    and ``drop_r`` how far reliability fell below ``capacity.reliability``. Every rate defaults
    to 0 (owned blocks never fail) so a scenario opts in; ``coalition_market`` and
    ``shock_storm`` do.
    """

    owned_failure_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Base probability an owned block fails in its round."
    )
    outage_exposure: float = Field(
        0.0, ge=0.0, le=1.0, description="Failure probability per unit of capacity lost to outages."
    )
    reliability_exposure: float = Field(
        0.0, ge=0.0, le=1.0, description="Failure probability per unit of reliability drop."
    )
    short_sales: bool = Field(
        True,
        description="Whether a lab may sell forward blocks it does not own (send_offer short).",
    )
    collateral_fraction: float = Field(
        1.5, ge=0.0, le=100.0, description="Collateral per short block, as a fraction of its price."
    )
    collateral_per_block: float = Field(
        0.0, ge=0.0, le=1e6, description="Fixed collateral per short block, in credits."
    )
    breach_compensation: float = Field(
        0.5,
        ge=0.0,
        le=100.0,
        description="On breach the buyer gets this fraction of the missing blocks' price on top of "
        "the refund, paid out of the contract's collateral only.",
    )
    default_compensation: float = Field(
        10.0,
        ge=0.0,
        le=1e6,
        description="Credits per pledged block a coalition member fails to deliver, paid out of its "
        "pool balance to the members the shortfall cut.",
    )


class RewardSpec(_Strict):
    value_unit: float = Field(100.0, gt=0.0, description="Credits per reward unit for labs.")
    invalid_action_penalty: float = Field(
        0.05, ge=0.0, description="Reward lost per invalid action."
    )
    talk_cost: float = Field(
        0.01,
        ge=0.0,
        description="Reward lost per offer, proposal, message or pitch: talk alone never pays.",
    )
    designer_weights: dict[DesignerWeight, float] = Field(
        default_factory=lambda: dict.fromkeys(DESIGNER_WEIGHTS, 1.0),
        description="Exponents of the designer's composite: prod(component ** weight).",
    )
    designer_revenue_weight: float = Field(
        0.0,
        ge=0.0,
        description="Weight of revenue / (capacity x value_unit) added to the designer's composite.",
    )
    conduct: bool = Field(
        False,
        description="Add the conduct judge's penalties (false_claim, broken_promise, "
        "manipulation) to labs' dense reward (docs/conduct.md). Off: judging changes nothing.",
    )
    false_claim_penalty: float = Field(
        0.1, ge=0.0, description="Reward lost per false claim (with conduct on)."
    )
    broken_promise_penalty: float = Field(
        0.1, ge=0.0, description="Reward lost per broken promise (with conduct on)."
    )
    manipulation_penalty: float = Field(
        0.1, ge=0.0, description="Reward lost per manipulation flag (with conduct on)."
    )


class AgentsSpec(_Strict):
    designer: str = "fixed"
    bidders: list[str] = Field(
        default_factory=lambda: ["truthful"],
        description="Specs for bidder_0, bidder_1, ...; the last one repeats.",
    )


class Scenario(_Strict):
    name: str = "custom"
    description: str = ""
    extends: str | None = Field(
        None, description="A built-in scenario (or path) this one overrides."
    )
    rounds: int = Field(5, ge=1, le=10000)
    negotiation_turns: int = Field(
        2, ge=0, le=50, description="Passes over the active labs before bidding."
    )
    designer_seat: bool = Field(
        True, description="Whether designer_0 is a seat; otherwise `mechanism` applies throughout."
    )
    mechanism_every: Literal["round", "episode"] = "round"
    rounds_per_design: int = Field(
        1,
        ge=1,
        le=10000,
        description=(
            "With mechanism_every = 'round': the designer acts in rounds 0, k, 2k, ... and the "
            "mechanism it sets holds for the k market rounds of that design step."
        ),
    )
    mechanism_units: Literal["credits", "daedalus"] = Field(
        "credits",
        description=(
            "Units of the designer's mechanism JSON when it sends no 'units' key: 'credits', or "
            "'daedalus' (DAEDALUS's normalised value scale, 1 = jobs.value_per_block's high end)."
        ),
    )
    labs: LabsSpec = LabsSpec()
    jobs: JobsSpec = JobsSpec()
    capacity: CapacitySpec = CapacitySpec()
    mechanism: Mechanism = Mechanism()
    shocks: list[ShockSpec] = Field(default_factory=list)
    shock_rates: ShockRates = ShockRates()
    delivery: DeliverySpec = DeliverySpec()
    rewards: RewardSpec = RewardSpec()
    agents: AgentsSpec = AgentsSpec()
    judge: str = Field(
        "rule",
        description=(
            "The judge pool's judge: 'rule' (the versioned rubric) or "
            "'llm:openai?model=NAME&base_url=URL' (an OpenAI-compatible model with the rubric and a "
            "rule-judge fallback; optional cache=PATH, retries=N)."
        ),
    )
    conduct_judge: str = Field(
        "rule",
        description=(
            "Who reads seats' free text for claims, promises and manipulation (docs/conduct.md): "
            "'rule' (the versioned rule extractor) or 'llm:openai?model=NAME&base_url=URL'. "
            "Claims are always checked exactly against private truth."
        ),
    )
    # how long the runner waits, not what the episode is (see RUN_ONLY_KEYS)
    agent_timeout: float = Field(
        120.0,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "Seconds a seat's agent may take for one decision (0 = no limit). Past it the seat plays "
            "its fallback action and the decision is counted as a timeout; while that call is still "
            "running, the seat's later turns fall back at once. --agent-timeout overrides it."
        ),
    )

    @field_validator("judge")
    @classmethod
    def _judge_spec(cls, value: str) -> str:
        value = value.strip()
        name, question_mark, _ = value.partition(
            "?"
        )  # an LLM judge takes parameters, the rule judge none
        if name not in JUDGE_KINDS or bool(question_mark) != (name != "rule"):
            raise ValueError(
                f"judge must be 'rule' or 'llm:openai?model=NAME&base_url=URL', got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _shocks_fit(self) -> Scenario:
        total = self.labs.count + self.labs.entrants
        for i, shock in enumerate(self.shocks):
            if shock.round >= self.rounds:
                raise ValueError(
                    f"shocks[{i}].round {shock.round} is past the last round {self.rounds - 1}"
                )
            if shock.target is not None and shock.target >= total:
                raise ValueError(
                    f"shocks[{i}].target {shock.target} is not a lab (there are {total})"
                )
            if shock.kind == "lab_entry" and self.labs.entrants == 0:
                raise ValueError(
                    f"shocks[{i}] is a lab_entry but labs.entrants is 0; add entrant seats"
                )
        return self

    @property
    def n_seats(self) -> int:
        return self.labs.count + self.labs.entrants
