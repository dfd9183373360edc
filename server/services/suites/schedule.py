"""A suite's schedule (cron, 5 fields, UTC) and webhook, checked before they are stored."""

from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import urlsplit

from cronsim import CronSim, CronSimError

from sme2farm.server.services.errors import Invalid
from sme2farm.server.store.models import as_utc, utcnow


def next_fire(schedule: str, after: datetime) -> datetime:
    """The first time strictly after `after` the cron schedule (UTC) fires."""
    it = CronSim(schedule, as_utc(after).astimezone(timezone.utc).replace(second=0, microsecond=0))
    t = next(it)
    while t <= after:
        t = next(it)
    return t


def check_schedule(schedule: str) -> str:
    """Exactly five fields (cronsim would take a sixth as seconds, and Quartz-style schedules
    mean something else again): minute hour day month weekday, UTC."""
    schedule = " ".join(schedule.split())
    fields = schedule.split(" ") if schedule else []
    if len(fields) != 5:
        raise Invalid(f"schedule {schedule[:120]!r} has {len(fields)} field(s); a schedule is exactly 5 cron fields: "
                      "minute hour day month weekday, UTC (e.g. '0 3 * * *': nightly at 03:00)")
    try:
        next_fire(schedule, utcnow())
    except (CronSimError, StopIteration) as e:
        raise Invalid(f"schedule {schedule!r} is not a valid cron expression "
                      f"(minute hour day month weekday, UTC): {e}") from None
    return schedule


def check_webhook(url: str | None) -> str | None:
    if url is None or not url.strip():
        return None
    url = url.strip()
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as e:
        raise Invalid(f"webhook {url[:200]!r} is not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise Invalid(f"webhook {url[:200]!r} must be an http:// or https:// URL "
                      f"(scheme {parts.scheme or 'missing'!r})")
    if not parts.hostname:
        raise Invalid(f"webhook {url[:200]!r} has no host")
    return url
