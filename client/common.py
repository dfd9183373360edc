"""What the client's commands share: the farm client built from the arguments and settings, the
device selector, submitting and waiting for an experiment, the exit codes of a wait, and the wait
until a server answers GET /health (also used by `sme2-farm up`, bench/scale.py and the tests).
cli.py, kit.py, document.py, suites_cmd.py and artifacts_cmd.py build on it; it imports none of them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Callable

import httpx

from sme2farm.client.api import FarmClient, Patience, note
from sme2farm.client.config import client_settings
from sme2farm.client.render import experiment_text, progress_line, status_counts
from sme2farm.protocol import TERMINAL, DeviceSelector, RunStatus


def parse_selector(text: str | None) -> DeviceSelector | None:
    """--device 'platform=android,tags=lab1+big,serial=X' or a bare serial."""
    if not text:
        return None
    fields: dict = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            fields["serial"] = key.strip()
        elif key.strip() == "tags":
            fields["tags"] = [t for t in value.split("+") if t]
        elif key.strip() == "sme2":
            fields["sme2"] = value.strip().lower() in ("1", "true", "yes", "on")
        else:
            fields[key.strip()] = value.strip()
    return DeviceSelector.model_validate(fields)


# A run (R34) or an experiment (E12) as the commands taking either read it; a bare 34 is resolved
# by run_or_experiment.
REF = re.compile(r"^([ER]?)(\d{1,18})$", re.I)


class RefRefused(ValueError):
    """A run-or-experiment id that cannot be taken: `code` is the exit code (2: malformed or
    ambiguous, 1: nothing of that number exists), the message the sentence to print."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def experiment_id(text: str) -> int:
    """An argparse type for the commands that take an experiment only (status, cancel, scaling):
    12 or E12, the form artifacts and compare take; a run id is refused naming what it is."""
    m = REF.match(text.strip())
    if m and m.group(1).upper() == "R":
        raise argparse.ArgumentTypeError(f"{text!r} is a run id: this command takes an experiment (12 or E12)")
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not an experiment id: give 12 or E12")
    return int(m.group(2))


def run_or_experiment(client, text: str) -> tuple[str, int]:
    """'R34' -> ("run", 34), 'E12' -> ("experiment", 12). A bare number is a trap (`artifacts 3`
    read it as run 3, `compare 3` as experiment 3), so it is whichever exists and this token may
    read, said in one line on stderr; where both do it is refused naming both choices."""
    m = REF.match(text.strip())
    if not m:
        raise RefRefused(f"{text!r} is not a run or experiment id: give R34 for a run or E12 for an experiment", 2)
    prefix, number = m.group(1).upper(), int(m.group(2))
    if prefix:
        return ("run" if prefix == "R" else "experiment"), number
    run, experiment = client.run_exists(number), client.experiment_exists(number)
    if run and experiment:
        raise RefRefused(f"{number} is both run {number} and experiment {number}: give R{number} for the run or "
                         f"E{number} for the experiment", 2)
    if not run and not experiment:
        raise RefRefused(f"there is no run {number} and no experiment {number} (none this token may read)", 1)
    kind = "run" if run else "experiment"
    other = "experiment" if run else "run"
    print(f"sme2-client: {number} taken as {kind} {number} (no {other} {number} is visible; R{number} or "
          f"E{number} says which)", file=sys.stderr)
    return kind, number


def connect(args):
    """The FarmClient for --server/--token, or the settings (SME2_SERVER, SME2_TOKEN)."""
    settings = client_settings()
    token = args.token or (settings.token.get_secret_value() if settings.token else None)
    return FarmClient(args.server or settings.server, token)


def server_healthy(url: str) -> bool:
    """One look: does the server at `url` answer GET /health with 200 now? No answer within 1 s,
    or a refused connection, is a no."""
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def wait_healthy(url: str, timeout: float, *, every: float = 0.1, check: Callable[[], None] | None = None) -> bool:
    """Poll GET /health every `every` s until the server at `url` answers 200 (True) or `timeout` s
    have passed (False: the caller says what that means). `check` runs before each look and may
    raise to abandon, e.g. when the process that should answer has exited."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if server_healthy(url):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


# How often a wait asks: FIRST_POLL_S after the submission, then a pause that grows with the time
# already waited (POLL_FRACTION of it, at most MAX_POLL_S): a short run is seen ended soon after it
# is, and a long wait asks rarely (one request per MAX_POLL_S).
FIRST_POLL_S = 0.02
POLL_FRACTION = 0.1
MAX_POLL_S = 2.0


def poll_pause(waited_s: float) -> float:
    """The pause before the next look, `waited_s` seconds into a wait."""
    return min(MAX_POLL_S, max(FIRST_POLL_S, POLL_FRACTION * waited_s))


def wait_for(client, experiment_id: int, *, quiet: bool, timeout: float | None = None, check=None, patience=None):
    """Poll until every run is terminal (poll_pause: often at first, less as the wait goes on);
    progress goes to stderr. `check` may raise to abandon. Transient faults (the server
    restarting, the database away, a 429) are waited out, and the whole wait is bounded by
    `timeout` or by the `patience` given (client/api.py Patience): past it, GaveUp (a
    TimeoutError) says what it waited for and what it saw last."""
    began = time.monotonic()
    if patience is None:
        patience = Patience(client, f"experiment {experiment_id} to finish", timeout, say=None if quiet else note)
    last = ""
    while True:
        if check is not None:
            check()
        rep = patience.call(client.experiment, experiment_id)
        counts = status_counts(rep)  # a summary report lists no runs: all([]) would say done
        done = all(s in TERMINAL for s in counts) and (rep.runs_total is None or sum(counts.values()) >= rep.runs_total)
        line = progress_line(rep)
        patience.seen = f"it was last {line}"
        if not quiet and line != last:
            print(line, file=sys.stderr)
            last = line
        if done:
            return rep
        patience.check()
        time.sleep(min(poll_pause(time.monotonic() - began), patience.left()))


def submit_and_follow(args, model: Path, spec, inputs: Path | None, origin: str = "", vs_model: Path | None = None,
                      etrecord: Path | None = None) -> int:
    """Upload, then print the experiment (--json), or wait for it (--wait) and print its report."""
    client = connect(args)
    if not args.wait:
        rep = client.submit(model, spec, inputs=inputs, vs_model=vs_model, etrecord=etrecord)
        say_warnings(rep)
        say_devices(rep)
        if args.json:
            print(json.dumps(client.experiment_json(rep.id), indent=2))
        else:
            print(f"submitted experiment {rep.id} ({len(rep.runs)} run(s)){origin}; "
                  f"follow with: sme2-client status {rep.id}")
        return 0
    # --wait: one patience, one --timeout, from the upload to the report
    patience = Patience(client, "the server to take the submission", args.timeout, say=None if args.json else note)
    rep = patience.call(client.submit, model, spec, inputs=inputs, vs_model=vs_model, etrecord=etrecord,
                        idempotent=False)
    say_warnings(rep)
    say_devices(rep)
    patience.what = f"experiment {rep.id} to finish"
    return print_when_done(args, client, rep.id, patience)


def etrecord_beside(model: Path) -> Path | None:
    """The model's ETRecord where an export leaves it: `<model>.pte.etrecord` (the kit's name, and
    `sme2-client examples`'), else `<stem>.etrecord`; None when neither is a file."""
    for path in (model.with_name(model.name + ".etrecord"), model.with_suffix(".etrecord")):
        if path.is_file():
            return path
    return None


def etrecord_note(model: Path, found: Path | None) -> str:
    """The one line submit says about the ETRecord it did not get with --etrecord: the sibling it took,
    or how to export one."""
    if found is not None:
        return f"sme2-client: taking the ETRecord beside the model, {found} (--etrecord FILE to send another)"
    return (f"sme2-client: no ETRecord beside {model.name}: operators will not be attributed to modules; export one "
            f"with to_edge_transform_and_lower(..., generate_etrecord=True), then "
            f"get_etrecord().save('{model.name}.etrecord') beside the .pte, or pass --etrecord FILE")


def say_warnings(rep) -> None:
    """What the submission left out (a device long offline, an SME2-on arm no device here can
    run), once, on stderr: said at submission, not discovered run by run."""
    for w in rep.warnings:
        print(f"sme2-client: warning: {w}", file=sys.stderr)


def say_devices(rep) -> None:
    """Without --device an experiment goes to every device that can take it (the host and the
    emulator, on `sme2-farm up --emulator`): one line on stderr names them and says why."""
    if rep.spec.device is not None:
        return
    if rep.runs_detail == "summary":   # a summary answer lists run groups, not runs
        seen = [(g.device, g.emulator) for g in rep.run_groups or [] if g.device]
    else:
        seen = [(r.device.serial, r.device.emulator) for r in rep.runs if r.device]
    named = [f"{serial} (emulated)" if emulator else serial for serial, emulator in dict(seen).items()]
    if named:
        print(f"sme2-client: no --device given, so on every device that can take it: {', '.join(named)} "
              f"(--device SERIAL or --device platform=... chooses)", file=sys.stderr)


# Exit codes of the commands that wait for runs (submit --wait, status --wait, suite run --wait).
EXIT_OK, EXIT_FAILED, EXIT_UNSCHEDULABLE = 0, 1, 3
EXIT_CODES_HELP = (f"Exit codes with --wait: {EXIT_OK} when every run that could run succeeded; "
                   f"{EXIT_UNSCHEDULABLE} when some runs were unschedulable (e.g. the SME2-on arm on a farm without "
                   f"SME2) and none failed; {EXIT_FAILED} when a run failed or was cancelled, the farm refused "
                   f"or could not be reached; 2 on bad arguments.")


def outcome_code(reports) -> int:
    """The exit code for finished experiments: a failed or cancelled run is a failure; runs that
    could not be placed are told apart (3), so a script on an x86 host can accept them."""
    statuses = {s for rep in reports for s in status_counts(rep)}
    if statuses & {RunStatus.failed, RunStatus.cancelled}:
        return EXIT_FAILED
    return EXIT_UNSCHEDULABLE if RunStatus.unschedulable in statuses else EXIT_OK


def print_when_done(args, client, experiment_id: int, patience) -> int:
    """Wait for the experiment (patiently), then print its report (--json: the report JSON);
    returns the exit code (outcome_code)."""
    rep = wait_for(client, experiment_id, quiet=args.json, patience=patience)
    if args.json:
        print(json.dumps(patience.call(client.experiment_json, experiment_id), indent=2))
    else:
        rep = patience.call(client.experiment, experiment_id)
        print(experiment_text(rep))
    return outcome_code([rep])
