"""GET /comparisons: two experiments (or runs) matched arm by arm, each pair with its verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ComparisonSide(BaseModel):
    kind: Literal["experiment", "run"]
    id: int
    variant: Literal["A", "B"]
    experiment_id: int
    name: str | None
    model_sha256: str | None
    et_versions: list[str]
    runner_builds: list[str]


class Unmatched(BaseModel):
    side: Literal["baseline", "candidate"]
    device_model: str
    sme2: str
    threads: int
    mode: str
    why: str


class ComparisonRead(BaseModel):
    """GET /comparisons."""

    baseline: ComparisonSide
    candidate: ComparisonSide
    comparisons: list[dict[str, Any]] = Field(
        description="Per matched device model x SME2 x threads x mode: the pair's keys and analysis.compare's "
                    "verdict (complete) or the reason it has none (incomplete)")
    unmatched: list[Unmatched]
    notes: list[str]
    program_memory: dict[str, Any] | None = Field(
        default=None, description="Both sides' planned memory and weights (from their programs) and the exact change "
                                  "(analysis.memory.planned_compared); None when neither side's was recorded")
