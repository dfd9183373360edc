"""GET /comparisons: any two experiments (or runs), matched by device model, SME2 arm, threads and
mode (services/comparisons.py between)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from sme2farm.protocol import DEFAULT_MIN_EFFECT, ComparisonRead
from sme2farm.server.api.deps import SessionDep, SettingsDep, StoreDep, UserDep
from sme2farm.server.api.errors import INVALID, NOT_FOUND
from sme2farm.server.services import comparisons as comparison_service
from sme2farm.server.services import owners

router = APIRouter(tags=["comparisons"])
Ref = Annotated[str, Query(min_length=1, max_length=40, description=comparison_service.REF_HELP)]


@router.get("/comparisons", response_model=ComparisonRead, responses={**NOT_FOUND, **INVALID})
def compare(baseline: Ref, candidate: Ref, session: SessionDep, user: UserDep, store: StoreDep, settings: SettingsDep,
            min_effect: Annotated[float, Query(ge=0.0, le=0.5,
                                               description="smallest difference to claim")] = DEFAULT_MIN_EFFECT,
            ) -> ComparisonRead:
    """Verdicts (ratio baseline/candidate: > 1 means the candidate is faster, 95% interval with the
    devices' noise models) for every device model x SME2 arm x threads x mode both sides ran;
    `unmatched` says what one side ran that the other did not, `notes` what differs (ExecuTorch
    version, runner build, device)."""
    require_read_sides(session, user, settings, baseline=baseline, candidate=candidate)
    return comparison_service.between(session, baseline=baseline, candidate=candidate, store=store,
                                      min_effect=min_effect)


def require_read_sides(session, user, settings, *, baseline: str, candidate: str) -> None:
    """owners.require_read for both sides (an experiment, or a run's experiment)."""
    for text, which in ((baseline, "baseline"), (candidate, "candidate")):
        kind, ident, _ = comparison_service.parse_ref(text, which)
        check = owners.require_read_run if kind == "run" else owners.require_read
        check(session, token=user, team_only=settings.reads_team_only, which=f"{which}: ",
              **{f"{kind}_id": ident})
