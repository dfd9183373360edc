"""Comparisons: two arms' verdict with their numerics, as an experiment's report and GET
/comparisons carry them.

Its shape is analysis/comparison_types.py's dataclasses, the one definition: analysis.compare
builds them, the server stores them, and the parts are served here as they are (a dataclass is a
pydantic type). `Comparison` itself is the read model derived from the dataclass field for field
at import (a renamed field renames both), so an answer keeps the read models' methods
(model_validate, model_copy) its readers use."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from pydantic import Field, create_model

from sme2farm.analysis import comparison_types as ct
from sme2farm.analysis.comparison_types import (ArmMemory, CategoryShare, CategoryVerdict, CoverageCompared,
                                                KernelPathsCompared, LlmCompared, MemoryCompared, ModuleVerdict,
                                                Needed, NoiseUsed, Numerics, OperatorVerdict, OutputNumerics,
                                                OutputTolerance, PhaseVerdict, VarianceComponents, Verdict)

from .common import Read
from .runs import ProgramMemory

__all__ = ["ArmMemory", "CategoryShare", "CategoryVerdict", "Comparison", "ComparisonPage", "ComparisonRead",
           "ComparisonSide", "CoverageCompared", "KernelPathsCompared", "LlmCompared", "MemoryCompared",
           "ModuleVerdict", "Needed", "NoiseUsed", "Numerics", "OperatorVerdict", "OutputNumerics", "OutputTolerance",
           "PartVerdict", "PhaseVerdict", "ProgramMemoryCompared", "Unmatched", "VarianceComponents", "Verdict",
           "read_model"]

PartVerdict = CategoryVerdict  # a category's verdict: every field optional, as a category a comparison lacks reads


def read_model(cls: type) -> type[Read]:
    """The read model of an analysis dataclass: its fields, types, defaults and descriptions."""
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        kw = {"description": f.metadata["description"]} if "description" in f.metadata else {}
        if f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kw["default_factory"] = f.default_factory
        fields[f.name] = (hints[f.name], Field(**kw))
    return create_model(cls.__name__, __base__=Read, __module__=__name__, __doc__=cls.__doc__, **fields)


Comparison = read_model(ct.Comparison)


class ProgramMemoryCompared(Read):
    """Two programs' planned memory and weights (analysis.memory.planned_compared): exact, no statistics."""

    baseline: ProgramMemory | None
    candidate: ProgramMemory | None
    change: dict[str, float | None] = Field(description="planned_bytes, weights_bytes, ... -> candidate / baseline - 1")
    sentence: str


class ComparisonSide(Read):
    kind: Literal["experiment", "run"]
    id: int
    variant: Literal["A", "B"]
    experiment_id: int
    name: str | None
    model_sha256: str | None
    et_versions: list[str]
    runner_builds: list[str]


class Unmatched(Read):
    side: Literal["baseline", "candidate"]
    device_model: str
    sme2: str
    threads: int
    mode: str
    why: str


class ComparisonPage(Read):
    """GET /experiments/{id}/comparisons: an experiment's comparisons in full, a page of them (the
    report's summary answer carries only their headlines: ExperimentReport.comparisons_detail)."""

    experiment_id: int
    items: list[Comparison] = Field(description="The comparisons in the report's order (device, threads, mode, "
                                                "kind), each in full: operators, narrative, noise, numerics "
                                                "per output, memory")
    total: int = Field(description="How many comparisons match the filters (all of them without filters)")
    page: int
    page_size: int


class ComparisonRead(Read):
    """GET /comparisons."""

    baseline: ComparisonSide
    candidate: ComparisonSide
    comparisons: list[Comparison] = Field(
        description="Per matched device model x SME2 x threads x mode: the pair's keys and analysis.compare's "
                    "verdict (complete) or the reason it has none (incomplete)")
    unmatched: list[Unmatched]
    notes: list[str]
    program_memory: ProgramMemoryCompared | None = Field(
        default=None, description="Both sides' planned memory and weights (from their programs) and the exact change "
                                  "(analysis.memory.planned_compared); None when neither side's was recorded")
