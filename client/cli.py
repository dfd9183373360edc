"""sme2-client: submit models, follow experiments, list devices, analyse traces offline."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import get_args

import httpx
from pydantic import ValidationError

from sme2farm.client import analyze_cmd, artifacts_cmd, document, examples_cmd, kit, kit_dir, scaling_cmd, suites_cmd
from sme2farm.client.api import (FarmError, Patience, default_of, error_sentences, note, say_refusal, transport_words,
                                 wire)
from sme2farm.client.common import (EXIT_CODES_HELP, RefRefused, connect, etrecord_beside, etrecord_note,
                                    experiment_id, parse_selector, print_when_done, run_or_experiment,
                                    submit_and_follow)
from sme2farm.client.config import client_settings
from sme2farm.client.render import comparison_text, devices_text, experiment_text, progress_line
from sme2farm.protocol import (DEFAULT_ITERATIONS, DEFAULT_METHOD, DEFAULT_MIN_EFFECT, DEFAULT_POWER_PROFILE,
                               DEFAULT_WARMUP, ExperimentSpec, LlmSpec, PowerProfile,
                               Sme2Request)

MIN_EFFECT_HELP = f"default {DEFAULT_MIN_EFFECT:g}: {DEFAULT_MIN_EFFECT * 100:g}%%"  # argparse help: %% is %


def thread_counts(text: str) -> list[int]:
    """--threads 1,4 as a list; `--threads abc` is a sentence, not int()'s message."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a thread count: give comma-separated whole numbers, "
                                         f"e.g. 1 or 1,4") from None
    if not counts:
        raise argparse.ArgumentTypeError("give at least one thread count, e.g. 1 or 1,4")
    return counts


def parse_llm(text: str | None) -> LlmSpec | None:
    """--llm 'prompt=128,decode=64'."""
    if not text:
        return None
    fields: dict = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in ("prompt", "decode"):
            raise ValueError(f"--llm takes prompt=P,decode=D (e.g. prompt=128,decode=64), got {text!r}")
        try:
            fields[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"--llm {key.strip()} must be a whole number of tokens, got {value.strip()!r}") from None
    if set(fields) != {"prompt", "decode"}:
        raise ValueError(f"--llm needs both prompt and decode (e.g. prompt=128,decode=64), got {text!r}")
    return LlmSpec.model_validate(fields)


def cmd_submit(args) -> int:
    if getattr(args, "kit_config", None):
        return kit.cmd_submit(args)
    if not args.model:
        print("sme2-client: submit needs the .pte file (or --kit-config CONFIG.json)", file=sys.stderr)
        return 2
    if args.any_platform:
        print("sme2-client: --any-platform is for --kit-config (a model without one goes wherever --device says)",
              file=sys.stderr)
        return 2
    model = Path(args.model)
    if not model.is_file():
        print(f"sme2-client: {model} is not a file", file=sys.stderr)
        return 2
    inputs = Path(args.inputs) if args.inputs else None
    vs_model = Path(args.vs) if args.vs else None
    etrecord = Path(args.etrecord) if args.etrecord else None
    for path in (inputs, vs_model, etrecord):
        if path is not None and not path.is_file():
            print(f"sme2-client: {path} is not a file", file=sys.stderr)
            return 2
    try:
        threads = thread_counts(args.threads)
    except argparse.ArgumentTypeError as e:
        print(f"sme2-client: --threads: {e}", file=sys.stderr)
        return 2
    try:
        labels = dict(kv.split("=", 1) for kv in args.label or [])
        # unnamed, an experiment is called after its model file (not a hash prefix and "(unnamed)")
        name = args.name if args.name is not None else model.stem
        spec = ExperimentSpec(sme2=args.sme2, threads=threads, iterations=args.iterations, warmup=args.warmup,
                              mode=args.mode, device=parse_selector(args.device), name=name, labels=labels,
                              power_profile=args.power_profile, core_mask=args.core_mask, sessions=args.sessions,
                              method=args.method, min_effect=args.min_effect, llm=parse_llm(args.llm))
    except ValidationError as e:
        for line in error_sentences(e.errors(include_url=False)):
            print(f"sme2-client: invalid spec: {line}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"sme2-client: invalid spec: {e}", file=sys.stderr)
        return 2
    if etrecord is None:
        etrecord = etrecord_beside(model)
        print(etrecord_note(model, etrecord), file=sys.stderr)
    return submit_and_follow(args, model, spec, inputs, vs_model=vs_model, etrecord=etrecord)


def cmd_status(args) -> int:
    client = connect(args)
    if getattr(args, "kit_json", None) is not None:
        return kit.cmd_status_kit_json(client, args.id, args.kit_json)
    if args.wait:
        patience = Patience(client, f"experiment {args.id} to finish", args.timeout, say=None if args.json else note)
        return print_when_done(args, client, args.id, patience)
    if args.json:
        print(json.dumps(client.experiment_json(args.id), indent=2))
    else:
        print(experiment_text(client.experiment(args.id)))
    return 0


def cmd_compare(args) -> int:
    client = connect(args)
    sides = []
    for text in (args.baseline, args.candidate):
        if not text.strip().isdigit():   # E12, E12/B and R34 say which; the server reads them
            sides.append(text)
            continue
        try:
            kind, number = run_or_experiment(client, text)
        except RefRefused as e:
            print(f"sme2-client: {e}", file=sys.stderr)
            return e.code
        sides.append(f"{kind[0].upper()}{number}")
    result = client.compare(*sides, min_effect=args.min_effect)
    print(json.dumps(wire(result), indent=2) if args.json else comparison_text(result))
    return 0 if any(c.status == "complete" for c in result.comparisons) else 1


def cmd_cancel(args) -> int:
    print(progress_line(connect(args).cancel(args.id)))
    return 0


def cmd_list(args) -> int:
    owner = "me" if args.mine else args.owner
    page = connect(args).experiments(page=args.page, page_size=args.page_size, owner=owner)
    if args.json:
        print(page.model_dump_json(indent=2))
        return 0
    # The name says what was run: a submission is named after its model file unless --name says
    # otherwise, a suite's experiment "suite S: MODEL". The model's hash only where there is no name
    # (the same model's experiments by hash: --json, or `status ID`).
    print(f"{'id':>5}  {'status':<11} {'runs':>4}  {'created':<20} {'owner':<12} name")
    for e in page.items:
        print(f"{e.id:>5}  {e.status:<11} {e.runs:>4}  {e.created_at:%Y-%m-%d %H:%M:%S}  {(e.owner or '-')[:12]:<12} "
              f"{e.name or f'model {e.model_sha256[:12]}'}")
    print(f"page {page.page} of {max(1, -(-page.total // page.page_size))} ({page.total} experiments)")
    return 0


def cmd_devices(args) -> int:
    devices = connect(args).devices()
    if args.json:
        print(json.dumps(wire(devices), indent=2))
        return 0
    print(devices_text(devices))
    return 0


def cmd_analyze(args) -> int:
    return analyze_cmd.run(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sme2-client", description="Profile ExecuTorch models on the SME2 farm.",
                                epilog=EXIT_CODES_HELP + " `compare` has its own (see compare --help).")
    p.add_argument("--server", help="farm URL (default: SME2_SERVER or http://127.0.0.1:8000)")
    p.add_argument("--token", help="API token (default: SME2_TOKEN)")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("submit", help="upload a .pte and queue runs", epilog=EXIT_CODES_HELP)
    s.add_argument("model", nargs="?", help="the .pte, or a .bpte bundled program (its inputs are fed) (not with --kit-config)")
    s.add_argument("--kit-config", metavar="CONFIG.json",
                   help="run an SME2 learning-path kit config (model, SME2 on/off experiments) as one experiment; "
                        "one written for mac or android (its file, experiment or runner names say so) goes to "
                        "devices of that platform only, and is refused where the farm has none")
    s.add_argument("--any-platform", action="store_true",
                   help="with --kit-config: run a config written for mac or android on whatever devices match here "
                        "(e.g. the x86 host and the emulator) instead")
    s.add_argument("--sme2", choices=list(get_args(Sme2Request)), default=default_of(ExperimentSpec, "sme2"))
    s.add_argument("--threads", default=",".join(map(str, default_of(ExperimentSpec, "threads"))),
                   help="comma-separated thread counts, e.g. 1,4")
    s.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    s.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    s.add_argument("--mode", choices=["timing", "trace"], default=default_of(ExperimentSpec, "mode"))
    s.add_argument("--device", help="selector: a serial, or platform=android,tags=a+b,sme2=true")
    s.add_argument("--name", help="default: the model file's name without .pte")
    s.add_argument("--label", action="append", help="key=value (repeatable)")
    s.add_argument("--power-profile", choices=list(get_args(PowerProfile)), default=DEFAULT_POWER_PROFILE)
    s.add_argument("--core-mask", help="taskset mask in hex, same for both arms")
    s.add_argument("--sessions", type=int, default=default_of(ExperimentSpec, "sessions"),
                   help="timed sessions per arm, interleaved off/on/on/off")
    s.add_argument("--inputs", metavar="INPUTS.npz",
                   help="representative inputs for a .pte: arrays '0','1',... in input order (a .bpte brings its own)")
    s.add_argument("--method", default=DEFAULT_METHOD, help=f"the program method to run (default {DEFAULT_METHOD})")
    s.add_argument("--llm", metavar="prompt=P,decode=D",
                   help="LLM mode: prefill P tokens, then decode D one at a time, per iteration (default: detected "
                        "from a method taking tokens [1, S] + input_pos [1] int64, prompt min(128, S/2), decode "
                        "min(64, S/4))")
    s.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT,
                   help=f"the smallest difference a verdict may claim: a fraction, 0 <= x <= 0.5 ({MIN_EFFECT_HELP})")
    s.add_argument("--vs", metavar="B.pte",
                   help="a second model run interleaved with the first on the same devices, per SME2 arm: "
                        "the report gives the A->B verdict (the same file twice is an A/A check)")
    s.add_argument("--etrecord", metavar="FILE",
                   help="the model's ETRecord (its export's generate_etrecord=True): each operator is attributed to "
                        "its module and source line (default: <model>.pte.etrecord or <stem>.etrecord beside the "
                        "model, if there is one; with --vs, the ETRecord is the first model's)")
    s.add_argument("--wait", action="store_true", help="follow progress and print the report")
    s.add_argument("--timeout", type=float, default=None,
                   help="with --wait: give up after this many seconds (server restarts, database outages and 429s "
                        "within it are waited out)")
    s.add_argument("--json", action="store_true", help="print the report JSON")
    s.set_defaults(fn=cmd_submit)

    st = sub.add_parser("status", help="show one experiment's report", epilog=EXIT_CODES_HELP)
    st.add_argument("id", type=experiment_id, help="experiment id (12 or E12)")
    st.add_argument("--json", action="store_true")
    st.add_argument("--wait", action="store_true", help="follow progress until every run has ended, then print the report")
    st.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")
    st.add_argument("--kit-json", nargs="?", const="", default=None, metavar="PATH",
                    help="write the kit's analysis_summary.json (default ./analysis_summary.json; - for stdout)")
    st.set_defaults(fn=cmd_status)

    cp = sub.add_parser("compare", help="compare two experiments or runs (matched by device model, SME2, threads, mode)",
                        description="Exit codes: 0 when at least one pair has a verdict; 1 when no pair could be "
                                    "compared (every pair 'no comparison') or the server refused (e.g. 422: nothing "
                                    "matched); 2 on bad arguments.")
    cp.add_argument("baseline", help="experiment id (E12; E12/B: an A/B experiment's B model) or run id (R34); a bare "
                                     "12 where only one of run 12 and experiment 12 exists")
    cp.add_argument("candidate", help="the same forms; speedup > 1 means the candidate is faster")
    cp.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT,
                    help=f"the smallest difference to claim: a fraction, 0 <= x <= 0.5 ({MIN_EFFECT_HELP})")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(fn=cmd_compare)

    ca = sub.add_parser("cancel", help="cancel an experiment's queued and running runs")
    ca.add_argument("id", type=experiment_id, help="experiment id (12 or E12)")
    ca.set_defaults(fn=cmd_cancel)

    ls = sub.add_parser("list", help="list experiments, newest first")
    ls.add_argument("--page", type=int, default=1)
    ls.add_argument("--page-size", type=int, default=20)
    ls.add_argument("--json", action="store_true")
    whose = ls.add_mutually_exclusive_group()
    whose.add_argument("--mine", action="store_true", help="only the experiments this token's user submitted")
    whose.add_argument("--owner", metavar="USER", help="only this user's experiments")
    ls.set_defaults(fn=cmd_list)

    dv = sub.add_parser("devices", help="list the farm's devices")
    dv.add_argument("--json", action="store_true")
    dv.set_defaults(fn=cmd_devices)

    an = sub.add_parser("analyze", help="analyse ETDump traces offline (no server needed)")
    analyze_cmd.add_arguments(an)
    an.set_defaults(fn=cmd_analyze)

    suites_cmd.add_parsers(sub)  # suite create|list|run [--wait]|show|delete|pause|resume, regressions [--ack ID]

    examples_cmd.add_parser(sub)  # examples [NAME [OUT.pte]]
    artifacts_cmd.add_parser(sub)  # artifacts ID [NAME] [-o DIR], artifacts E<id> --kit -o DIR
    kit_dir.add_import_parser(sub)  # import DIR: a kit run directory measured outside the farm
    scaling_cmd.add_parser(sub)  # scaling ID [--json]

    document.add_parser(sub)  # report ID --markdown|--html [-o FILE] [--svg-files]
    return p


def server_of(args) -> str:
    """The farm's URL: --server, else the client settings' SME2_SERVER, without a trailing slash."""
    return (getattr(args, "server", None) or client_settings().server).rstrip("/")


# What to do next after the server's refusal, by status: the server's words say what was wrong,
# these where to fix it on this side.
NEXT_STEP = {
    401: "set SME2_TOKEN (or --token) to the farm's token: `sme2-farm up` prints where it is (DATA_DIR/token)",
    403: "this token's scope does not allow it: ask for a token with `sme2-farm token create --scope submit` (or admin)",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
        sys.stdout.flush()  # here, so a reader that left (`| head`) is caught below, not at exit
        return code
    except BrokenPipeError:
        # `sme2-client list | head`: the reader left, which is not an error to tell. Point stdout
        # at /dev/null so the interpreter's final flush does not raise (and print) it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE
    except FarmError as e:
        say_refusal(e)
        if e.status in NEXT_STEP:
            print(f"sme2-client: {NEXT_STEP[e.status]}", file=sys.stderr)
        return 1
    except ValidationError as e:  # a spec or selector built here (e.g. --device in suite create)
        for line in error_sentences(e.errors(include_url=False)):
            print(f"sme2-client: invalid: {line}", file=sys.stderr)
        return 2
    except httpx.TransportError as e:
        print(f"sme2-client: cannot reach the farm at {server_of(args)} ({transport_words(e)}): is `sme2-farm up` "
              f"running there? (set SME2_SERVER or --server to its URL)", file=sys.stderr)
        return 1
    except TimeoutError as e:
        print(f"sme2-client: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"sme2-client: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
