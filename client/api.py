"""The user's HTTP client for the farm's REST API (httpx)."""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx

from pydantic import BaseModel

from sme2farm.client.fields import known
from sme2farm.protocol import (DEFAULT_MIN_EFFECT, Comparison, ComparisonPage, ComparisonRead, DeviceRead,
                               ExperimentPage, ExperimentReport, ExperimentSpec, RegressionRead, RunReport, ScalingRead,
                               SeriesRead, SuiteDeleted, SuiteDetail, SuitePatch, SuiteRead, SuiteRunStarted, SuiteSpec)


_BOUNDS = {"less_than_equal": "<=", "less_than": "<", "greater_than_equal": ">=", "greater_than": ">"}
_WHERE = {"body", "query", "path", "header", "form", "spec"}


@dataclass(frozen=True)
class Problem:
    """One entry of pydantic's / FastAPI's validation error list, as the server sends it."""

    loc: Any = ()
    msg: Any = "invalid"
    type: Any = ""
    ctx: Any = None


@dataclass(frozen=True)
class ErrorBody:
    """A server's error body: FastAPI's {detail}, or a 409's {reason, message, previous_state}."""

    detail: Any = None
    message: Any = None


def error_sentences(errors: list[dict[str, Any]]) -> list[str]:
    """Pydantic's / FastAPI's validation error list -> one sentence per problem, e.g.
    "thresholds.min_effect: must be <= 0.5" (no input echo, no documentation URL)."""
    out = []
    for e in errors:
        if not isinstance(e, dict):
            out.append(str(e))
            continue
        problem = known(Problem, e)
        loc = [str(x) for x in problem.loc or ()]
        while loc and loc[0] in _WHERE:
            loc = loc[1:]
        where = ".".join(x if not x.isdigit() else f"[{x}]" for x in loc).replace(".[", "[")
        kind, ctx, msg = problem.type, problem.ctx or {}, str(problem.msg)
        if kind in _BOUNDS and ctx:
            msg = f"must be {_BOUNDS[kind]} {next(iter(ctx.values()))}"
        elif kind == "missing":
            msg = "is required"
        elif kind == "extra_forbidden":
            msg = "is not a known field"
        elif msg.startswith(("Value error, ", "Assertion failed, ")):
            msg = msg.split(", ", 1)[1]
        out.append(f"{where}: {msg}" if where else msg)
    return out


def describe(detail: Any) -> str:
    """A server's error body as text: FastAPI's validation list as one line per problem, a
    409's {reason, message} as its message, a plain detail as is."""
    if isinstance(detail, list):
        return "\n".join(error_sentences(detail))
    if isinstance(detail, dict):
        body = known(ErrorBody, detail)
        if isinstance(body.detail, (str, list, dict)):
            return describe(body.detail)
        if "message" in detail:
            return str(body.message)
        return json.dumps(detail)
    return str(detail)


class FarmError(Exception):
    """A 4xx/5xx from the server, with its message (validation lists already turned into sentences)
    and its Retry-After in seconds (None when it sent none)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.retry_after = status, message, retry_after


# Answers that mean "not now" rather than "no": the database away (503), a rate limit (429), the
# server restarting behind a proxy (502, 504). A 500 is a bug: waiting does not fix it.
TRANSIENT = frozenset({429, 502, 503, 504})
# The longest unbroken fault a wait without --timeout sits through (a database failover, a
# server restarted by its supervisor take seconds; a farm away for minutes is news to tell).
OUTAGE_S = 300.0
# ... and before the server ever answered this client: then a refused connection is more likely
# a wrong --server or a farm not started than a restart, and a user should hear so soon.
FIRST_CONTACT_S = 10.0
RETRY_AFTER_MAX_S = 60.0

T = TypeVar("T")


class GaveUp(TimeoutError):
    """A patient wait ran out: the message says what it waited for and what it last saw."""


class Patience:
    """Calls to the farm that wait out transient faults (connection refused or dropped, 503 with
    its Retry-After, 429, 502/504) with backoff and jitter, within one bound for the whole wait:
    `timeout` seconds when given, else OUTAGE_S of unbroken fault (FIRST_CONTACT_S before the
    server ever answered). Past it, GaveUp says what was waited for and what was seen last.

    Only reads are retried blindly. A non-idempotent call (the submission) is retried only where
    the server provably did nothing: the connection was never made, or a 429 (refused before the
    route ran). A 503 or a dropped connection may come after the experiment was stored, and a
    second upload would make a second experiment."""

    def __init__(self, client: "FarmClient", what: str, timeout: float | None = None, *,
                 outage_s: float = OUTAGE_S, say: Callable[[str], None] | None = None):
        self.client, self.what, self.say = client, what, say
        self.start, self.timeout = time.monotonic(), timeout
        self.deadline = None if timeout is None else self.start + timeout
        self.outage_s = outage_s
        self.seen = ""                     # what the wait saw last (wait_for: the progress line)
        self.fault = ""                    # the fault being waited out, "" when the last call answered
        self.fault_since: float | None = None

    def left(self) -> float:
        return float("inf") if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """GaveUp once the whole wait's timeout has passed."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise GaveUp(self.sentence())

    def sentence(self) -> str:
        now = time.monotonic()
        took = f"{self.timeout:g}" if self.deadline is not None and now >= self.deadline else f"{now - self.start:.0f}"
        text = f"gave up after {took} s waiting for {self.what}"
        if self.fault and self.fault_since is not None:
            return f"{text}: the server at {self.client.server} {self.fault} for the last {now - self.fault_since:.0f} s"
        return f"{text}: {self.seen}" if self.seen else text

    def call(self, fn: Callable[..., T], *args: Any, idempotent: bool = True, **kw: Any) -> T:
        delay = 0.5
        while True:
            if self.deadline is not None:   # a server that hangs must not hold the wait past --timeout
                self.client.http.timeout = httpx.Timeout(min(self.client.timeout, max(1.0, self.left())))
            sent = time.monotonic()
            try:
                out = fn(*args, **kw)
            except httpx.TransportError as e:
                unreached = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                if not idempotent and not unreached:
                    raise
                fault = f"{'could not be reached' if unreached else 'did not answer'} ({transport_words(e)})"
                after = 0.0
            except FarmError as e:
                if e.status not in (TRANSIENT if idempotent else {429}):
                    raise
                fault, after = f"answered {e.status} ({e.message.split(';')[0].strip()})", e.retry_after or 0.0
            else:
                if self.fault and self.say is not None:
                    self.say(f"the server at {self.client.server} answers again after "
                             f"{time.monotonic() - self.fault_since:.0f} s")
                self.fault, self.fault_since = "", None
                return out
            now = time.monotonic()
            if self.fault_since is None:
                self.fault_since = sent
            changed, self.fault = fault != self.fault, fault
            wait = max(delay * (0.5 + random.random()), min(after, RETRY_AFTER_MAX_S))
            bound = self.outage_s if self.client.answered else FIRST_CONTACT_S
            if self.deadline is not None:
                end = self.deadline
            else:
                end = self.fault_since + bound
            if now >= end:
                raise GaveUp(self.sentence())
            wait = min(wait, end - now)   # one last try at the bound, not a sleep past it
            if changed and self.say is not None:
                self.say(f"the server at {self.client.server} {fault}; waiting for {self.what}, retrying")
            time.sleep(wait)
            delay = min(delay * 2, 10.0)


def transport_words(e: httpx.TransportError) -> str:
    """A connection failure in words, without Python's errno framing: "connection refused"."""
    text = str(e) or type(e).__name__
    if "] " in text and text.startswith("[Errno"):
        text = text.split("] ", 1)[1]
    return text[:1].lower() + text[1:]


def say_refusal(e: FarmError) -> None:
    """The server's refusal on stderr, one line per problem it named (describe)."""
    for line in e.message.splitlines() or [""]:
        print(f"sme2-client: server said {e.status}: {line}", file=sys.stderr)


def note(line: str) -> None:
    """A wait's progress note: to stderr, so stdout stays the report."""
    print(f"sme2-client: {line}", file=sys.stderr)


class FarmClient:
    def __init__(self, server: str, token: str | None, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server, self.timeout = server.rstrip("/"), timeout
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout, transport=transport)
        self.answered = False   # has the server ever answered this client (Patience: a wrong URL or a restart?)

    def _check(self, r: httpx.Response) -> httpx.Response:
        self.answered = True
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            try:
                retry_after = float(r.headers["retry-after"])
            except (KeyError, ValueError):   # absent, or an HTTP date (this server sends seconds)
                retry_after = None
            raise FarmError(r.status_code, describe(body), retry_after)
        return r

    def submit(self, model: Path, spec: ExperimentSpec | dict[str, Any], inputs: Path | None = None,
               vs_model: Path | None = None, etrecord: Path | None = None) -> ExperimentReport:
        """Upload a .pte (with an optional inputs .npz) or a .bpte; the server tells them apart by content.
        `vs_model`: a second .pte run interleaved with the first (A/B; the same file for A/A).
        `etrecord`: the model's ETRecord (the server checks it against the model)."""
        spec_json = spec.model_dump_json(exclude_none=True) if isinstance(spec, ExperimentSpec) else json.dumps(spec)
        with contextlib.ExitStack() as stack:
            # The file objects stream; the server never sees a local file name as a path. (part, name
            # sent, local file): only the model's and an inputs file's base names travel (the
            # experiment's name when the spec has none; the report's inputs line).
            parts = [("model", Path(model).name, model),
                     ("vs_model", "vs_model.pte", vs_model),
                     ("inputs", Path(inputs).name if inputs is not None else "", inputs),
                     ("etrecord", "model.etrecord", etrecord)]
            files = {part: (sent, stack.enter_context(open(local, "rb")), "application/octet-stream")
                     for part, sent, local in parts if local is not None}
            r = self.http.post("/experiments", files=files, data={"spec": spec_json})
        return ExperimentReport.model_validate(self._check(r).json())

    def import_kit(self, manifest: dict[str, Any], model: Path, traces: list[Path],
                   logs: dict[int, Path] | None = None, etrecord: Path | None = None,
                   suite: str | None = None) -> ExperimentReport:
        """POST /experiments/import: a kit run directory's manifest, its model and each result's
        trace (traces[i] is results[i]'s) and runner log, as numbered parts; only the bytes travel,
        never a local path."""
        with contextlib.ExitStack() as stack:
            files: list[tuple[str, tuple]] = [("model", ("model.pte", stack.enter_context(open(model, "rb")),
                                                         "application/octet-stream"))]
            if etrecord is not None:
                files.append(("etrecord", ("model.etrecord", stack.enter_context(open(etrecord, "rb")),
                                           "application/octet-stream")))
            for i, trace in enumerate(traces):
                files.append((f"etdump.{i}", (f"{i}.etdump", stack.enter_context(open(trace, "rb")),
                                              "application/octet-stream")))
            for i, log in sorted((logs or {}).items()):
                files.append((f"log.{i}", (f"{i}.log", stack.enter_context(open(log, "rb")), "text/plain")))
            data = {"manifest": json.dumps(manifest), **({"suite": suite} if suite else {})}
            r = self.http.post("/experiments/import", files=files, data=data)
        return ExperimentReport.model_validate(self._check(r).json())

    def experiment_file(self, experiment_id: int, name: str) -> bytes | None:
        """An experiment's model.pte, vs_model.pte or model.pte.etrecord; None when it has none."""
        r = self.http.get(f"/experiments/{experiment_id}/files/{name}")
        if r.status_code == 404 and "has no" in r.text:
            return None
        return self._check(r).content

    def experiment(self, experiment_id: int, runs: str | None = None) -> ExperimentReport:
        """GET /experiments/{id}. runs: None, the server's default (every run up to 2,000, above that a
        summary: run groups and comparison headlines); "full" for every run and comparison whatever the
        size (what a command that reads the runs needs: the document, the kit summary, the artifacts)."""
        params = {"runs": runs} if runs else {}
        return ExperimentReport.model_validate(self._check(self.http.get(f"/experiments/{experiment_id}",
                                                                         params=params)).json())

    def experiment_comparisons(self, experiment_id: int, page_size: int = 100) -> list[Comparison]:
        """GET /experiments/{id}/comparisons, every page: the experiment's comparisons in full (a
        summary report, comparisons_detail headline, carries only their headlines)."""
        out: list[Comparison] = []
        page = 1
        while True:
            r = self.http.get(f"/experiments/{experiment_id}/comparisons",
                              params={"page": page, "page_size": page_size})
            got = ComparisonPage.model_validate(self._check(r).json())
            out += got.items
            if not got.items or len(out) >= got.total:
                return out
            page += 1

    def experiment_json(self, experiment_id: int) -> dict[str, Any]:
        return self._check(self.http.get(f"/experiments/{experiment_id}")).json()

    def scaling(self, experiment_id: int, joined: list[int] | None = None) -> ScalingRead:
        params = {"with": ",".join(map(str, joined))} if joined else {}
        r = self.http.get(f"/experiments/{experiment_id}/scaling", params=params)
        return ScalingRead.model_validate(self._check(r).json())

    def scaling_chart(self, experiment_id: int, joined: list[int] | None = None) -> str:
        """The scaling chart (SVG text): every device, core mask and SME2 setting of the view."""
        params = {"with": ",".join(map(str, joined))} if joined else {}
        return self._check(self.http.get(f"/experiments/{experiment_id}/charts/scaling.svg", params=params)).text

    def experiments(self, page: int = 1, page_size: int = 20, owner: str | None = None) -> ExperimentPage:
        """A page of experiments; `owner`: only that user's (`me`: this token's user's)."""
        params = {"page": page, "page_size": page_size, **({"owner": owner} if owner else {})}
        r = self.http.get("/experiments", params=params)
        return ExperimentPage.model_validate(self._check(r).json())

    def run(self, run_id: int) -> RunReport:
        return RunReport.model_validate(self._check(self.http.get(f"/runs/{run_id}")).json())

    def run_exists(self, run_id: int) -> bool:
        """Is there a run `run_id` this token may read? (404: no; any other refusal is raised)"""
        return self._found(self.http.get(f"/runs/{run_id}"))

    def experiment_exists(self, experiment_id: int) -> bool:
        """Is there an experiment `experiment_id` this token may read? Asked with its first
        comparison only, not its report."""
        return self._found(self.http.get(f"/experiments/{experiment_id}/comparisons", params={"page_size": 1}))

    def _found(self, r: httpx.Response) -> bool:
        if r.status_code == 404:
            self.answered = True
            return False
        self._check(r)
        return True

    def artifact(self, run_id: int, name: str) -> bytes:
        return self._check(self.http.get(f"/runs/{run_id}/artifacts/{name}")).content

    def devices(self) -> list[DeviceRead]:
        return [DeviceRead.model_validate(d) for d in self._check(self.http.get("/devices")).json()]

    def compare(self, baseline: str, candidate: str, min_effect: float = DEFAULT_MIN_EFFECT) -> ComparisonRead:
        """GET /comparisons: baseline/candidate are experiment ids (12, E12, E12/B) or run ids (R34)."""
        params = {"baseline": baseline, "candidate": candidate, "min_effect": min_effect}
        return ComparisonRead.model_validate(self._check(self.http.get("/comparisons", params=params)).json())

    def cancel(self, experiment_id: int) -> ExperimentReport:
        return ExperimentReport.model_validate(self._check(self.http.post(f"/experiments/{experiment_id}/cancel")).json())

    # suites and regressions (server/api/suites.py)
    def create_suite(self, spec: SuiteSpec | dict[str, Any]) -> SuiteRead:
        """POST /suites. A dict is sent as given: the server's validation answers for it (422)."""
        body = spec.model_dump(mode="json", exclude_unset=True) if isinstance(spec, SuiteSpec) else spec
        return SuiteRead.model_validate(self._check(self.http.post("/suites", json=body)).json())

    def suites(self) -> list[SuiteRead]:
        return [SuiteRead.model_validate(s) for s in self._check(self.http.get("/suites")).json()]

    def suite(self, name: str) -> SuiteDetail:
        return SuiteDetail.model_validate(self._check(self.http.get(f"/suites/{name}")).json())

    def run_suite(self, name: str) -> SuiteRunStarted:
        return SuiteRunStarted.model_validate(self._check(self.http.post(f"/suites/{name}/run")).json())

    def update_suite(self, name: str, changes: SuitePatch) -> SuiteRead:
        """PATCH /suites/{name}: the fields set in `changes` change (unset ones are not sent)."""
        body = changes.model_dump(mode="json", exclude_unset=True)
        return SuiteRead.model_validate(self._check(self.http.patch(f"/suites/{name}", json=body)).json())

    def delete_suite(self, name: str) -> SuiteDeleted:
        return SuiteDeleted.model_validate(self._check(self.http.delete(f"/suites/{name}")).json())

    def suite_series(self, name: str) -> SeriesRead:
        return SeriesRead.model_validate(self._check(self.http.get(f"/suites/{name}/series")).json())

    def regressions(self, suite: str | None = None, candidates: bool = False) -> list[RegressionRead]:
        params: dict[str, Any] = {"candidates": candidates, **({"suite": suite} if suite else {})}
        rows = self._check(self.http.get("/regressions", params=params)).json()
        return [RegressionRead.model_validate(r) for r in rows]

    def acknowledge(self, change_id: int) -> RegressionRead:
        r = self._check(self.http.post(f"/regressions/{change_id}/acknowledge"))
        return RegressionRead.model_validate(r.json())


def default_of(model: type[BaseModel], name: str) -> Any:
    """A field's default as the wire schema declares it (an option's default is the server's)."""
    return model.model_fields[name].get_default(call_default_factory=True)


def wire(value: BaseModel | list[BaseModel]) -> Any:
    """A model (or a list of them) as the JSON the server sent: the fields it gave, none added,
    timestamps as it wrote them (what `--json` prints)."""
    if isinstance(value, list):
        return [wire(v) for v in value]
    return value.model_dump(mode="json", exclude_unset=True)
