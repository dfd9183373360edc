"""`sme2-client analyze`: offline analysis of ETDump files, no server needed.

    sme2-client analyze TRACE.etdump [--compare OTHER.etdump] [--skip-first N] [--model PTE [--etrecord FILE]]
                        [--kernel-log FILE] [--json | --markdown | --csv | --perfetto OUT.json]
    sme2-client analyze --outputs BASE.bin CAND.bin [--labels BASE CAND] [--json]

--compare: TRACE is the baseline, OTHER the candidate (speedup > 1: OTHER is faster), with the
calibrated verdict of analysis/verdict.py (one trace per arm cannot see run-to-run noise, so the
interval is widened by --noise-model or a conservative default). --model with its ETRecord traces
each operator to the module and line that made it. --outputs compares two runner outputs files
(analysis/numerics.py). Loads numpy and sme2farm.analysis only: no torch, no HTTP client, no pydantic.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sme2farm.analysis import (EtdumpError, NoiseModel, analyze, compare, compare_emulated, numerics, to_csv,
                               to_markdown, to_perfetto, to_terminal)
from sme2farm.analysis.by_module import call_site_lines, tree as module_tree
from sme2farm.analysis.types import AnalysisReport, ModuleTime, as_report
from sme2farm.analysis.verdict import DEFAULT_MIN_EFFECT
from sme2farm.client.fields import known
from sme2farm.runners import inputs as containers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", default=None, help="ETDump file (.etdump / .etdp)")
    parser.add_argument("--outputs", nargs=2, metavar=("BASE.bin", "CAND.bin"), default=None,
                        help="compare two runner outputs files (outputs.bin) instead of analysing a trace")
    parser.add_argument("--compare", metavar="OTHER", default=None,
                        help="second ETDump: TRACE is the baseline, OTHER the candidate")
    parser.add_argument("--labels", nargs=2, metavar=("BASE", "CAND"), default=None,
                        help="names for TRACE and OTHER (or the two --outputs files) in the comparison")
    parser.add_argument("--skip-first", type=int, default=0, metavar="N",
                        help="drop the first N iterations as warm-up (traces from the upstream "
                             "executor_runner include them)")
    parser.add_argument("--kernel-log", metavar="FILE", default=None,
                        help="XNNPACK log (runner stdout or logcat) with 'Using ... microkernel' lines")
    parser.add_argument("--compare-kernel-log", metavar="FILE", default=None,
                        help="kernel log for OTHER")
    parser.add_argument("--sme2", choices=("on", "off"), default=None,
                        help="the arm TRACE ran in: on = XNNPACK could see SME2 (an SME2 CPU, not hidden), off = it "
                             "could not. Unknown by default: packed-LHS operators are then SME/SME2, not counted as SME2")
    parser.add_argument("--compare-sme2", choices=("on", "off"), default=None, help="the arm OTHER ran in")
    parser.add_argument("--arch", choices=("arm64", "x86_64"), default=None,
                        help="the CPU architecture of the traces (unknown by default: XNNPACK operators are then "
                             "'NEON or x86 SIMD' unless a packed-LHS operator shows arm64)")
    parser.add_argument("--emulated", metavar="EMULATOR", default=None,
                        help="an emulator ran these traces (e.g. 'qemu-aarch64 11.1.3'): their times are the "
                             "emulator's, so they are labelled and --compare states no speed verdict. Found by itself "
                             "when a farm run's report.json lies beside a trace")
    parser.add_argument("--model", metavar="PTE", default=None,
                        help="the .pte the traces ran: with its ETRecord, operators are traced to modules and lines")
    parser.add_argument("--etrecord", metavar="FILE", default=None,
                        help="the model's ETRecord (default: <model>.pte.etrecord or <stem>.etrecord beside --model)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--noise-model", metavar="FILE.json", default=None,
                        help="the device's noise model (JSON from NoiseModel.to_json(), learned from A/A "
                             "runs): widens the interval by its between-session noise instead of the "
                             "conservative default")
    parser.add_argument("--min-effect", type=float, default=DEFAULT_MIN_EFFECT, metavar="FRACTION",
                        help=f"smallest difference claimed (default {DEFAULT_MIN_EFFECT:g} = "
                             f"{DEFAULT_MIN_EFFECT * 100:g}%%)")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON report")
    fmt.add_argument("--markdown", action="store_true", help="Markdown report")
    fmt.add_argument("--csv", action="store_true", help="CSV of per-iteration latencies")
    fmt.add_argument("--perfetto", metavar="OUT.json", default=None,
                     help="write a Chrome/Perfetto trace of one iteration to OUT.json")
    parser.add_argument("--iteration", type=int, default=0,
                        help="iteration drawn by --perfetto (default 0, after --skip-first)")
    parser.add_argument("--top", type=int, default=15, help="operators shown in the table")
    parser.add_argument("--kit-json", nargs="?", const="", default=None, metavar="PATH",
                        help="also write the SME2 kit's analysis_summary.json (default: beside TRACE; "
                             "- for stdout only), for scripts written against the kit")


def _read_text(path: str | None) -> str | None:
    if path is None:
        return None
    return Path(path).read_text(errors="replace")


@dataclass(frozen=True)
class _RunReportBeside:
    """The one field read of a farm run's report.json downloaded beside a trace."""

    emulator: str | None = None


def _emulator_beside(trace: str | None) -> str | None:
    """The emulator a farm run's report.json next to `trace` names (its artifacts downloaded
    together), else None: an ETDump itself does not say what executed it."""
    if trace is None:
        return None
    try:
        data = json.loads((Path(trace).parent / "report.json").read_text())
    except (OSError, ValueError):
        return None
    return (known(_RunReportBeside, data).emulator or None) if isinstance(data, dict) else None


def _what_else(data: bytes) -> str:
    """What a file that is not an outputs container looks like, to say so plainly ("" if unknown)."""
    if data[4:8] == b"ET12":
        return "this is a .pte program, not an outputs file"
    if data[4:8] == b"BP08":
        return "this is a .bpte bundled program, not an outputs file"
    if data[8:12] == b"ED00":
        return "this is an ETDump trace, not an outputs file (analyse it without --outputs)"
    return ""


@dataclass(frozen=True)
class _NumericsSaid:
    """What the text reads of numerics.compare()'s answer (its JSON is what --json prints)."""

    status: str = ""
    sentence: str = ""
    outputs: list = field(default_factory=list)


def run_outputs(args: argparse.Namespace) -> int:
    if args.trace is not None or args.compare is not None:
        print("error: --outputs compares two outputs files; give no trace (and no --compare) with it", file=sys.stderr)
        return 2
    if args.markdown or args.csv or args.perfetto:
        print("error: --outputs prints text or --json", file=sys.stderr)
        return 2
    sides = []
    for path in args.outputs:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            sides.append(containers.named_values(containers.read(data, item="output")))
        except containers.InputsError as exc:
            print(f"error: {path}: {_what_else(data) or exc}", file=sys.stderr)
            return 2
    labels = tuple(args.labels) if args.labels else tuple(Path(p).name for p in args.outputs)
    result = numerics.compare(sides[0], sides[1], labels)
    said = known(_NumericsSaid, result)
    # 0: compared; 1: the two files cannot be compared (different outputs), as a script needs to know
    code = 0 if said.status == "compared" else 1
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
        return code
    print(said.sentence)
    for o in map(numerics.OutputDiff.from_dict, said.outputs):
        snr = "identical" if o.identical else ("n/a" if o.snr_db is None else f"{o.snr_db:.1f} dB")
        rel = "n/a" if o.max_rel is None else f"{o.max_rel:.3g}"
        print(f"  output {o.index}: {o.dtype} {o.shape}  max abs {o.max_abs:.3g}  max rel {rel}  "
              f"SNR {snr}  {'within' if o.within_tolerance else 'BEYOND'} {o.tolerance.describe}")
    return code


def run(args: argparse.Namespace) -> int:
    if getattr(args, "outputs", None):
        return run_outputs(args)
    if args.trace is None:
        print("error: give an ETDump file to analyse, or --outputs BASE.bin CAND.bin", file=sys.stderr)
        return 2
    if not 0.0 <= args.min_effect < 1.0:
        print(f"error: --min-effect must be in [0, 1), got {args.min_effect}", file=sys.stderr)
        return 2
    noise = None
    if args.noise_model:
        try:
            noise = NoiseModel.from_json(Path(args.noise_model).read_text())
        except (OSError, ValueError) as exc:
            print(f"error: --noise-model {args.noise_model}: {exc}", file=sys.stderr)
            return 2
    try:
        data = Path(args.trace).read_bytes()
        wrong = _not_a_trace(data, args.trace) or (_not_a_trace(Path(args.compare).read_bytes(), args.compare)
                                                   if args.compare else None)
        if wrong:
            print(f"error: {wrong}", file=sys.stderr)
            return 2
        if args.perfetto:
            trace = to_perfetto(data, iteration=args.iteration + args.skip_first)
            Path(args.perfetto).write_text(json.dumps(trace))
            print(f"wrote {args.perfetto} ({len(trace['traceEvents'])} events): open it in "
                  "https://ui.perfetto.dev", file=sys.stderr)
            return 0
        arm = {"on": True, "off": False, None: None}
        traced = _attribution_inputs(args)
        if isinstance(traced, int):
            return traced
        typed = as_report(analyze(data, kernel_log=_read_text(args.kernel_log), skip_first=args.skip_first,
                                  sme2=arm[args.sme2], arch=args.arch, **traced))
        del data
        emulators = sorted({e for e in (args.emulated, _emulator_beside(args.trace), _emulator_beside(args.compare)) if e})
        emulator = ", ".join(emulators) or None
        typed.emulator = emulator  # the renderers label its times as the emulator's
        report = typed.to_dict()  # the JSON the comparison, the kit summary and --json read
        _flag_mismatch(typed, args)
        comparison = other = other_typed = None
        if args.compare:
            other_typed = as_report(analyze(Path(args.compare).read_bytes(),
                                            kernel_log=_read_text(args.compare_kernel_log), skip_first=args.skip_first,
                                            sme2=arm[args.compare_sme2], arch=args.arch, **traced))
            other_typed.emulator = emulator
            other = other_typed.to_dict()
            labels = tuple(args.labels) if args.labels else (Path(args.trace).name,
                                                              Path(args.compare).name)
            if emulator:  # an emulator's times are never a speed figure (analysis.compare_emulated)
                comparison = compare_emulated(report, other, emulator=emulator, labels=labels)
            else:
                comparison = compare(report, other, labels=labels, seed=args.seed, noise=noise,
                                     min_effect=args.min_effect)
    except EtdumpError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, IndexError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if args.kit_json is not None:
        from sme2farm.client import kit_json  # plain data: no HTTP client or wire schemas (client/kit.py's)
        try:
            dest = kit_json.summary_path(args.kit_json, Path(args.trace).resolve().parent)
        except kit_json.KitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        traces = [kit_json.KitTrace.of(args.trace, typed)] + (
            [kit_json.KitTrace.of(args.compare, other_typed)] if other_typed is not None else [])
        run_dir = str(dest.parent) if dest is not None else str(Path(args.trace).resolve().parent)
        kit_json.write_summary(kit_json.kit_summary(traces, run_dir=run_dir), dest)
        if dest is None:
            return 0
    if args.json:
        compared = {} if comparison is None else {"comparison": comparison, "compare_report": other}
        sys.stdout.write(json.dumps({**report, **compared}, indent=1) + "\n")
    elif args.markdown:
        sys.stdout.write(to_markdown(typed, comparison))
    elif args.csv:
        sys.stdout.write(to_csv(typed))
    else:
        sys.stdout.write(to_terminal(typed, _said_verdicts(comparison), top=args.top))
        sys.stdout.write(by_module_text(typed))
    return 0


def _attribution_inputs(args: argparse.Namespace) -> dict | int:
    """analyze()'s etrecord= and program= from --model and --etrecord (or the ETRecord beside the
    model, said on stderr); an exit code where they cannot be read."""
    if args.model is None:
        if args.etrecord is not None:
            print("error: --etrecord needs --model PTE: an ETRecord is checked against the program it belongs to",
                  file=sys.stderr)
            return 2
        return {}
    from sme2farm.analysis.etrecord import EtrecordError, read_etrecord

    try:
        program = Path(args.model).read_bytes()
    except OSError as exc:
        print(f"error: --model: {exc}", file=sys.stderr)
        return 2
    if program[4:6] != b"ET":
        print(f"error: --model {args.model} is not a .pte (no ExecuTorch program identifier)", file=sys.stderr)
        return 2
    path = args.etrecord
    if path is None:
        model = Path(args.model)
        path = next((str(p) for p in (Path(f"{model}.etrecord"), model.with_suffix(".etrecord")) if p.is_file()), None)
        if path is not None:
            print(f"using the ETRecord beside the model: {path}", file=sys.stderr)
    if path is None:
        return {"program": program}
    try:
        etrecord = read_etrecord(Path(path).read_bytes())
    except OSError as exc:
        print(f"error: --etrecord: {exc}", file=sys.stderr)
        return 2
    except EtrecordError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    args.etrecord = path
    return {"program": program, "etrecord": etrecord}


USED_PREFIX = "the ETRecord is not used: "


def _flag_mismatch(report: AnalysisReport, args: argparse.Namespace) -> None:
    if report.attribution is not None and report.attribution.status == "mismatch":
        # the analysis says "the ETRecord is not used: WHY"; the path takes its place, said once
        why = next((w for w in report.warnings if "ETRecord" in w), "it does not belong to this model")
        print(f"warning: {args.etrecord} is not used: {why.removeprefix(USED_PREFIX)}", file=sys.stderr)


def by_module_text(report: AnalysisReport, *, modules: int = 8, rows: int = 8) -> str:
    """A few lines: the heaviest modules (depth 1 and 2) and call sites, from an attributed report."""
    attribution = report.attribution
    if not report.by_module or attribution is None or report.emulator:  # an emulator's times are no
        return ""                                    # speed figure: render_text shows its kernel path per module
    lines = ["", f"time by module ({attribution.status}, {attribution.attributed_share:.0%} of operator time; "
                 "mean ms per iteration, share of E2E):"]
    # module_tree adds the model's own operators as one '(top level)' row, so the depth-1 rows and
    # the rest add up to E2E, as report --by module shows them
    data = report.to_dict()  # what analysis.by_module reads
    shown = [ModuleTime.from_dict(m) for m in module_tree(data, 2)]
    keep = {m.module for m in sorted((m for m in shown if m.depth in (1, 2)), key=lambda m: -m.ms)[:modules]}
    for m in shown:
        if m.depth == 0:
            lines.append(f"  {m.module:<32} {m.ms:9.3f} {m.share:6.1%}")
        elif m.module in keep:
            lines.append(f"  {'  ' * (m.depth - 1)}{m.module:<{34 - 2 * m.depth}} {m.ms:9.3f} "
                         f"{m.share:6.1%}" + (f"  {m.module_class}" if m.module_class else ""))
    lines.append("top call sites:")
    lines += [f"  {line}" for line in call_site_lines(data, rows)]
    return "\n".join(lines) + "\n"


def _not_a_trace(data: bytes, path: str) -> str | None:
    """A program given where a trace is wanted, told as such (not as unreadable trace bytes): the
    flatbuffer file identifier at bytes 4-8 is ET.. for a .pte, BP.. for a bundled program."""
    ident = data[4:8]
    if ident[:2] == b"ET":
        return (f"{path} is a .pte (a program, not a trace); analyze takes an .etdump: submit the model with "
                f"`sme2-client submit {path} --mode trace --wait`, then fetch the run's trace.etdump")
    if ident[:2] == b"BP":
        return f"{path} is a bundled program (.bpte), not a trace; analyze takes an .etdump"
    return None


def _said_verdicts(comparison: dict | None) -> dict | None:
    """The terminal text without a verdict printed as `None`: an operator or category whose
    interval could not be computed (too few samples) reads "no verdict"."""
    if not comparison:
        return comparison
    out = dict(comparison)
    for part in ("categories", "operators"):
        if out.get(part):
            out[part] = {k: {**v, "verdict": v.get("verdict") or "no verdict"} for k, v in out[part].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sme2-client analyze", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
