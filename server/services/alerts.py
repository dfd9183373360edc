"""Alerts: a confirmed model change POSTed as JSON to its suite's webhook: latency, a memory
figure past the suite's memory threshold or an LLM phase (the change's `metric`), one payload.

The Celery task (worker/tasks.py deliver_alert) calls :func:`prepare` in one short transaction,
:func:`post` with no transaction open (a slow webhook holds no database connection and no
lock), then :func:`record` in another. Retries are the task's (countdown doubling from
SME2_WEBHOOK_BACKOFF_S, at most SME2_WEBHOOK_ATTEMPTS deliveries); the delivery state, attempt
count and last error are on the change row (GET /regressions shows them). The task is sent
after the detection's commit and runs on its own, so a webhook that is down never holds up
ingest or dispatch.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy.orm import Session

from sme2farm import __version__
from sme2farm.server.services.errors import Invalid
from sme2farm.server.services.stored import change_values
from sme2farm.server.services.suites.changes import metric_of, values_of
from sme2farm.server.store.models import as_utc
from sme2farm.server.store.models import Suite, SuiteChange, SuitePoint, utcnow

DELIVERABLE = ("pending", "retrying")


@dataclass
class Delivery:
    url: str
    payload: dict[str, Any]
    event: str  # the X-SME2-Event header, the payload's own "event"


def event_of(change: SuiteChange) -> str:
    return f"sme2farm.{change.direction}"


def _links(base: str | None, experiment_id: int | None) -> dict[str, Any] | None:
    if experiment_id is None:
        return None
    base = (base or "").rstrip("/")
    return {"id": experiment_id, "api": f"{base}/experiments/{experiment_id}",
            "dashboard": f"{base}/#/experiments/{experiment_id}"}


def _point(p: SuitePoint | None) -> dict[str, Any] | None:
    """Where a change was measured: the point (suite run, time, experiment) and what it ran."""
    if p is None:
        return None
    at = as_utc(p.at)
    return {"id": p.id, "suite_run_id": p.suite_run_id, "at": at.isoformat() if at else None,
            "experiment_id": p.experiment_id, "runner": p.runner, "executorch_version": p.et_version}


def payload(*, change: SuiteChange, suite: Suite, public_url: str | None, point: SuitePoint | None = None,
            baseline_point: SuitePoint | None = None) -> dict[str, Any]:
    base = (public_url or "").rstrip("/")
    metric = metric_of(change)
    before, after = values_of(change)
    return {
        "event": event_of(change), "id": change.id, "suite": suite.name,
        "key": {"model_sha256": change.model_sha256, "model_name": change.model_name,
                "device_model": change.device_model, "sme2": change.sme2, "threads": change.threads},
        "metric": change.metric or "latency", "metric_name": metric.words, "unit": metric.unit,
        "before": before, "after": after, "point": _point(point), "baseline_point": _point(baseline_point),
        "direction": change.direction, "ratio": change.ratio, "ci_low": change.ci_low, "ci_high": change.ci_high,
        "status": change.status, "blamed": change.blamed, "sentence": change.sentence,
        "experiment": _links(base, change.experiment_id),
        "baseline_experiment": _links(base, change.baseline_experiment_id),
        "links": {"regressions": f"{base}/regressions", "series": f"{base}/suites/{suite.name}/series",
                  "acknowledge": f"{base}/regressions/{change.id}/acknowledge",
                  "dashboard": f"{base}/#/suites/{suite.name}"},
        "detected_at": change.detected_at.isoformat() if change.detected_at else None,
    }


def prepare(session: Session, *, change_id: int, public_url: str | None) -> Delivery | None:
    """What to POST, or None when there is nothing to deliver (delivered already, acknowledged
    meanwhile, the suite lost its webhook, the change is gone)."""
    change = session.get(SuiteChange, change_id)
    if change is None or change.webhook_state not in DELIVERABLE:
        return None
    suite = session.get(Suite, change.suite_id)
    if suite is None or not suite.webhook:
        change.webhook_state = "none"
        return None
    base_id = change_values(change.detail).baseline_point_id
    return Delivery(suite.webhook, payload(change=change, suite=suite, public_url=public_url,
                                           point=session.get(SuitePoint, change.point_id),
                                           baseline_point=session.get(SuitePoint, base_id) if base_id else None),
                    event_of(change))


class NotPublic(Invalid):
    """A webhook whose host is (or resolves to) an address the farm does not POST to."""


def _not_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return not ip.is_global or ip.is_multicast


def webhook_addresses(url: str, *, allow_private: bool) -> list[str]:
    """Every address the webhook's host resolves to, each checked: loopback, link-local, private
    and other non-public ones are refused (NotPublic, naming the rule, not the address) unless
    allow_private (SME2_WEBHOOK_PRIVATE_OK). Invalid when the host does not resolve."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, UnicodeError) as e:
        raise Invalid(f"webhook: its host {host!r} does not resolve ({type(e).__name__})") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not allow_private and (not addresses or any(_not_public(ipaddress.ip_address(a.split("%")[0]))
                                                   for a in addresses)):
        raise NotPublic("webhook: its host is or resolves to a loopback, link-local, private or other non-public "
                        "address; the farm POSTs to public addresses only (SME2_WEBHOOK_PRIVATE_OK=1 allows others)")
    return addresses


def post(delivery: Delivery, *, timeout_s: float, allow_private: bool = False) -> str | None:
    """One POST. None when the webhook took it (2xx), else the error, named. No redirects are
    followed (the payload goes to the URL configured, nowhere else). The host is resolved and
    checked now (webhook_addresses) and the POST goes to the address checked, the host name kept
    for Host and TLS, so a DNS answer that changes between check and connect cannot redirect it."""
    try:
        addresses = webhook_addresses(delivery.url, allow_private=allow_private)
    except NotPublic:
        return "refused: the host resolves to a non-public address"
    except Invalid:
        return "refused: the host does not resolve"
    parts = urlsplit(delivery.url)
    ip = addresses[0]
    netloc = (f"[{ip}]" if ":" in ip else ip) + (f":{parts.port}" if parts.port else "")
    pinned = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
            request = client.build_request(
                "POST", pinned, json=delivery.payload,
                headers={"User-Agent": f"sme2farm/{__version__}", "X-SME2-Event": delivery.event,
                         "Host": host},
                extensions={"sni_hostname": parts.hostname} if parts.scheme == "https" else None)
            r = client.send(request)
    except httpx.HTTPError as e:
        # the class only: an exception's text may carry the URL, whose path is often the secret
        return type(e).__name__
    if 200 <= r.status_code < 300:
        return None
    # the status only: the body is whatever the host answered, and read tokens see last_error
    return f"HTTP {r.status_code} {r.reason_phrase}"[:100]


def record(session: Session, *, change_id: int, error: str | None, max_attempts: int) -> str:
    """Store one attempt's outcome; returns the new state: delivered | retrying | failed (or the
    state it was moved to meanwhile, e.g. cancelled by an acknowledgement)."""
    change = session.get(SuiteChange, change_id)
    if change is None:
        return "gone"
    change.webhook_attempts += 1
    if error is None:
        change.webhook_state, change.webhook_last_error = "delivered", ""
        return "delivered"
    change.webhook_last_error = f"{utcnow().isoformat(timespec='seconds')} {error}"
    if change.webhook_state not in DELIVERABLE:
        return change.webhook_state
    change.webhook_state = "retrying" if change.webhook_attempts < max_attempts else "failed"
    return change.webhook_state
