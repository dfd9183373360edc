"""`sme2-client submit --kit-config CONFIG.json`: the Arm SME2 learning-path kit's pipeline config
(ArmDeveloperEcosystem/sme-executorch-profiling) submitted as ONE farm experiment, and `status ID
--kit-json`, the kit's analysis_summary.json of an experiment (written by client/kit_json.py).

The kit has no SME2 field: an experiment's arm is its runner build, named in the experiment's name
(`*_sme2_on` / `*_sme2_off`) and runner preset; the farm reads both and refuses a config where they
disagree or say nothing, rather than guess. One farm experiment runs every thread count on both arms
with one iteration count, warm-up, mode and core mask, so a config saying otherwise is refused naming
the field, before anything is uploaded; fields that cannot change a measurement (runner paths,
output_root) come back as warnings. A config written for mac or android goes to that platform's
devices only (`--any-platform` overrides): run elsewhere it would measure something its author did
not mean.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sme2farm.client.api import FarmError, say_refusal
from sme2farm.client.common import etrecord_beside, etrecord_note, parse_selector, submit_and_follow
from sme2farm.client.kit_json import KitError, KitTrace, kit_summary, summary_path, write_summary
from sme2farm.protocol import ExperimentReport, ExperimentSpec, RunStatus

# The kit's loader defaults (pipeline/config_loader.py): a field it reads but the user left out
# gets the value the kit itself would have used, so the same file measures the same thing.
KIT_DEFAULT_RUNS = 100
KIT_DEFAULT_WARMUP = 10
KIT_MODES = {"timing": "timing", "xnntrace": "trace"}


# A field the file leaves out, told apart from one it sets to null.
ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()


# The config as the file holds it: each JSON object read once into one of these (after its keys
# are checked against the fields), its values still unchecked; load_kit_config checks them.

@dataclass(frozen=True)
class _RawExperiment:
    """experiments[i]. The learning path's text documents num_runs / num_threads for the fields
    the kit's code calls runs / threads; both spellings are read."""
    name: Any = None
    runner_path: Any = None
    quiet_runner: Any = None
    mode: Any = "timing"
    runs: Any = ABSENT
    num_runs: Any = ABSENT
    warmup: Any = KIT_DEFAULT_WARMUP
    threads: Any = ABSENT
    num_threads: Any = ABSENT
    extra_args: Any = None
    cpu_affinity: Any = None


@dataclass(frozen=True)
class _RawConfig:
    model: Any = ABSENT
    output_root: Any = None
    experiments: Any = None
    analysis: Any = None


@dataclass(frozen=True)
class _RawAnalysis:
    compare_pairs: Any = None


@dataclass(frozen=True)
class _RawPair:
    baseline: Any = None
    candidate: Any = None
    label: Any = None


@dataclass(frozen=True)
class _RawPairEnd:
    experiment: Any
    threads: Any


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


TOP_LEVEL_FIELDS = _names(_RawConfig)
EXPERIMENT_FIELDS = _names(_RawExperiment)
_HEX_MASK = re.compile(r"^(0x)?[0-9a-fA-F]{1,16}$")
_OFF = re.compile(r"sme2[-_ ]?off(?![a-z])", re.I)
# The platform a config is written for, as the kit's templates name it: mac_template.json,
# "mac_sme2_on", cmake-out/mac-arm64/..., out_x/runs/android. Whole words only ("machine" is not mac).
PLATFORM_WORDS = {"macos": re.compile(r"(?<![a-z])(mac|macos|osx)(?![a-z])", re.I),
                  "android": re.compile(r"(?<![a-z])android(?![a-z])", re.I)}
PLATFORM_NAMES = {"macos": "macOS", "android": "Android"}
_ON = re.compile(r"sme2[-_ ]?on(?![a-z])", re.I)


class KitConfigError(KitError):
    """A kit config the farm cannot run as written; the message names the field or file."""


@dataclass
class KitSubmission:
    model: Path
    spec: ExperimentSpec
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the platforms the config is written for, each with where it says so ("experiments[0].name 'mac_sme2_on'")
    platforms: dict[str, str] = field(default_factory=dict)


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    # The kit converts with int(), so "10" works there; bools and fractions are mistakes.
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise KitConfigError(f"{where}: {value!r} is not an integer")
    try:
        n = int(value)
    except ValueError:
        raise KitConfigError(f"{where}: {value!r} is not an integer") from None
    if not lo <= n <= hi:
        raise KitConfigError(f"{where}: {n} must be between {lo} and {hi}")
    return n


def _threads(value: Any, where: str) -> list[int]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise KitConfigError(f"{where}: no thread count given")
    out = [_int(t, f"{where}", 1, 256) for t in items]
    if len(set(out)) != len(out):
        raise KitConfigError(f"{where}: thread counts {out} repeat")
    return out


def _arm_of(name: str, runner: str | None, where: str) -> str:
    """SME2 'on' or 'off' from the experiment name and the runner path (see module doc)."""
    by_name = "off" if _OFF.search(name) else "on" if (_ON.search(name) or "sme2" in name.lower()) else None
    by_runner = None
    if runner:
        by_runner = "off" if _OFF.search(runner) else "on" if _ON.search(runner) else None
    if by_name and by_runner and by_name != by_runner:
        raise KitConfigError(
            f"{where}: the name {name!r} says SME2 {by_name} but runner_path {runner!r} is an "
            f"SME2-{by_runner} build; fix one of them")
    arm = by_name or by_runner
    if arm is None:
        raise KitConfigError(
            f"{where}: cannot tell whether {name!r} runs with SME2 on or off; name it *_sme2_on or "
            "*_sme2_off as the kit's templates do")
    return arm


def _resolve_model(raw: Any, config: Path, cwd: Path) -> tuple[Path, str | None]:
    if not isinstance(raw, str) or not raw.strip():
        raise KitConfigError("model: must be the path of the .pte file")
    p = Path(raw).expanduser()
    if p.is_absolute():
        if p.is_file():
            return p, None
        raise KitConfigError(f"model: file not found: {p}")
    beside = config.parent / p
    if beside.is_file():
        return beside.resolve(), None
    # The kit's scripts run from the kit's root, so its shipped configs hold paths relative to
    # that (model_profiling/out_x/...); read such a config from there as the kit would.
    here = cwd / p
    if here.is_file():
        return here.resolve(), f"model: {here.resolve()} (taken from the current directory as the kit's scripts do; not found beside the config)"
    raise KitConfigError(
        f"model: file not found: {beside} (relative paths are read from the config's folder, "
        f"then from the current directory {cwd})")


def _compare_pairs(raw: Any, names: dict[str, tuple[str, list[int]]], warnings: list[str]) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise KitConfigError("analysis: must be an object")
    unknown = sorted(set(raw) - set(_names(_RawAnalysis)))
    if unknown:
        raise KitConfigError(f"analysis.{unknown[0]}: unknown field (the kit reads only analysis.compare_pairs)")
    pairs = _RawAnalysis(**raw).compare_pairs or []
    if not isinstance(pairs, list):
        raise KitConfigError("analysis.compare_pairs: must be a list")
    for i, given in enumerate(pairs):
        where = f"analysis.compare_pairs[{i}]"
        if not isinstance(given, dict):
            raise KitConfigError(f"{where}: must be an object")
        extra = sorted(set(given) - set(_names(_RawPair)))
        if extra:
            raise KitConfigError(f"{where}.{extra[0]}: unknown field")
        pair = _RawPair(**given)
        ends = []
        for side, end in (("baseline", pair.baseline), ("candidate", pair.candidate)):
            if not isinstance(end, dict) or not {"experiment", "threads"} <= set(end):
                raise KitConfigError(f"{where}.{side}: needs 'experiment' and 'threads'")
            extra = sorted(set(end) - set(_names(_RawPairEnd)))
            if extra:
                raise KitConfigError(f"{where}.{side}.{extra[0]}: unknown field")
            read = _RawPairEnd(**end)
            exp = read.experiment
            if exp not in names:
                raise KitConfigError(f"{where}.{side}.experiment: {exp!r} is not an experiment of this config")
            t = _int(read.threads, f"{where}.{side}.threads", 1, 256)
            if t not in names[exp][1]:
                raise KitConfigError(f"{where}.{side}.threads: experiment {exp!r} does not run {t} thread(s)")
            ends.append((exp, names[exp][0], t))
        (exp_a, arm_a, t_a), (exp_b, arm_b, t_b) = ends
        # The farm compares SME2 off with SME2 on at each thread count, always; any other pair
        # is a comparison it does not compute. It changes no measurement, so it is a warning.
        if not (arm_a != arm_b and t_a == t_b):
            label = pair.label or f"{exp_a} vs {exp_b}"
            warnings.append(
                f"{where} ({label!s}): not computed; the farm compares SME2 off with SME2 on at "
                "equal thread counts only (compare other runs offline with sme2-client analyze --compare)")


def load_kit_config(path: str | Path, *, cwd: Path | None = None) -> KitSubmission:
    """The kit's JSON config -> (model file, one ExperimentSpec, warnings). Raises KitConfigError."""
    config = Path(path)
    cwd = Path.cwd() if cwd is None else cwd
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KitConfigError(f"{config}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise KitConfigError(f"{config}: cannot read the config: {e}") from None
    except json.JSONDecodeError as e:
        raise KitConfigError(f"{config}: not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise KitConfigError(f"{config}: the config must be a JSON object")
    unknown = [k for k in raw if k not in TOP_LEVEL_FIELDS]
    if unknown:
        raise KitConfigError(f"{unknown[0]}: unknown field in the kit config (known: {', '.join(TOP_LEVEL_FIELDS)})")
    cfg = _RawConfig(**raw)
    if cfg.model is ABSENT:
        raise KitConfigError("model: missing (the path of the .pte file)")
    warnings: list[str] = []
    notes: list[str] = []

    given = cfg.experiments
    if not isinstance(given, list) or not given:
        raise KitConfigError("experiments: must be a non-empty list of experiments")

    # Every run of one farm experiment shares these; the first experiment sets them and every
    # other must agree, or the config cannot be expressed as one experiment.
    shared: dict[str, tuple[Any, int]] = {}
    arms: dict[str, dict[int, int]] = {}   # arm -> thread count -> experiment index
    names: dict[str, tuple[str, list[int]]] = {}
    runners: list[str] = []
    exps: list[_RawExperiment] = []
    for i, item in enumerate(given):
        where = f"experiments[{i}]"
        if not isinstance(item, dict):
            raise KitConfigError(f"{where}: must be an object")
        bad = [k for k in item if k not in EXPERIMENT_FIELDS]
        if bad:
            raise KitConfigError(f"{where}.{bad[0]}: unknown field (known: {', '.join(EXPERIMENT_FIELDS)})")
        exp = _RawExperiment(**item)
        exps.append(exp)
        name = exp.name
        if not isinstance(name, str) or not name.strip():
            raise KitConfigError(f"{where}.name: missing (the kit requires a name per experiment)")
        if name in names:
            raise KitConfigError(f"{where}.name: {name!r} is used twice")
        runner = exp.runner_path or exp.quiet_runner
        if runner is not None and not isinstance(runner, str):
            raise KitConfigError(f"{where}.runner_path: must be a path")
        if runner:
            runners.append(runner)
        arm = _arm_of(name, runner, where)

        mode = exp.mode
        if mode not in KIT_MODES:
            raise KitConfigError(f"{where}.mode: {mode!r} is not one of {', '.join(KIT_MODES)}")
        runs = _pick((("runs", exp.runs), ("num_runs", exp.num_runs)), where, KIT_DEFAULT_RUNS,
                     lambda v, w: _int(v, w, 1, 100_000))
        warmup = _int(exp.warmup, f"{where}.warmup", 0, 10_000)
        threads = _pick((("threads", exp.threads), ("num_threads", exp.num_threads)), where, [1], _threads)
        extra = exp.extra_args or []
        if not isinstance(extra, list):
            raise KitConfigError(f"{where}.extra_args: must be a list")
        if extra:
            # Arbitrary runner flags could change what is measured (or clash with the flags the
            # farm's runner is given); nothing is run rather than run something else.
            raise KitConfigError(
                f"{where}.extra_args: the farm cannot pass runner flags {extra!r}; remove them (it "
                "sets the iteration count, threads and ETDump path itself)")
        mask = exp.cpu_affinity
        if mask is not None and (not isinstance(mask, str) or not _HEX_MASK.match(mask)):
            raise KitConfigError(f"{where}.cpu_affinity: {mask!r} must be a hexadecimal CPU mask such as 0x80")

        for key, value in (("mode", mode), ("runs", runs), ("warmup", warmup), ("cpu_affinity", mask)):
            if key not in shared:
                shared[key] = (value, i)
            elif shared[key][0] != value:
                first, j = shared[key]
                raise KitConfigError(
                    f"{where}.{key}: {value!r} differs from experiments[{j}].{key} = {first!r}; the farm "
                    f"runs every run of one experiment with the same {key}: make them equal or split "
                    "the config")
        seen = arms.setdefault(arm, {})
        for t in threads:
            if t in seen:
                raise KitConfigError(
                    f"{where}.threads: SME2 {arm} at {t} thread(s) is already run by "
                    f"experiments[{seen[t]}] ({exps[seen[t]].name!r})")
            seen[t] = i
        names[name] = (arm, threads)

    on, off = (sorted(arms.get(arm, ())) for arm in ("on", "off"))
    if len(arms) == 2 and on != off:
        raise KitConfigError(
            f"experiments[].threads: SME2 on runs threads {on} but SME2 off runs {off}; the farm "
            "runs every thread count on both arms: make them equal or split the config")
    _compare_pairs(cfg.analysis, names, warnings)

    model, note = _resolve_model(cfg.model, config, cwd)
    if note:
        notes.append(note)
    if runners:
        warnings.append(
            "experiments[].runner_path: not used; the farm runs its own registered SME2-on/off "
            "builds on the matching devices (choose devices with --device, e.g. platform=android)")
    if cfg.output_root:
        warnings.append(
            f"output_root: not used; results stay on the farm (write the kit's analysis_summary.json "
            f"with: sme2-client status ID --kit-json {Path(str(cfg.output_root)) / 'analysis_summary.json'})")

    ordered: list[int] = []
    for arm in ("off", "on"):
        for t in arms.get(arm, {}):
            if t not in ordered:
                ordered.append(t)
    if len(ordered) > 16:
        raise KitConfigError(f"experiments[].threads: {len(ordered)} thread counts; the farm takes at most 16")
    sme2 = "both" if len(arms) == 2 else next(iter(arms))
    labels = {"kit_config": config.name[:256]}
    for arm in ("on", "off"):
        arm_names = [n for n, (a, _) in names.items() if a == arm]
        if arm_names:
            labels[f"kit_sme2_{arm}"] = ",".join(arm_names)[:256]
    mode, runs, warmup, mask = (shared[key][0] for key in ("mode", "runs", "warmup", "cpu_affinity"))
    try:
        spec = ExperimentSpec(sme2=sme2, threads=ordered, iterations=runs, warmup=warmup, mode=KIT_MODES[mode],
                              core_mask=mask, name=config.stem[:200], labels=labels)
    except ValidationError as e:  # the checks above should make this unreachable
        raise KitConfigError(f"{config}: {e}") from None
    named = [(exp.name, f"experiments[{i}].name") for i, exp in enumerate(exps)]
    named += [(exp.runner_path or exp.quiet_runner or "", f"experiments[{i}].runner_path")
              for i, exp in enumerate(exps)]
    named += [(str(cfg.output_root or ""), "output_root"), (config.name, "the config's file name")]
    platforms: dict[str, str] = {}
    for text, where in named:
        for platform, words in PLATFORM_WORDS.items():
            if platform not in platforms and words.search(text):
                platforms[platform] = f"{where} {text!r}"
    return KitSubmission(model=model, spec=spec, warnings=warnings, notes=notes, platforms=platforms)


def _pick(spellings: tuple[tuple[str, Any], tuple[str, Any]], where: str, default: Any, parse) -> Any:
    """A field the kit's code and the learning path's text spell differently ((name, value) each,
    ABSENT where the file leaves it out); both must agree."""
    got = [(k, parse(v, f"{where}.{k}")) for k, v in spellings if v is not ABSENT]
    if len(got) == 2 and got[0][1] != got[1][1]:
        (first, a), (second, b) = got
        raise KitConfigError(f"{where}.{second}: {b!r} contradicts {first} = {a!r}")
    return got[0][1] if got else default


def summary_from_experiment(rep: ExperimentReport, server: str = "") -> tuple[list[KitTrace], str]:
    """(traces, model) from the server's experiment report: its succeeded runs, each labelled with
    its trace's address on the server and read by kit_json.kit_summary as the typed run (whose
    entry for an emulated run says whose its times are)."""
    traces = [KitTrace(f"{server}/runs/{run.id}/artifacts/trace.etdump", run, run.device.emulator if run.device else None)
              for run in rep.runs if run.status == RunStatus.succeeded and run.categories_ms is not None]
    return traces, f"sha256:{rep.model_sha256}"


def devices_of(rep: ExperimentReport) -> list[str]:
    """The serials of the devices the experiment's succeeded runs ran on, in order."""
    return list(dict.fromkeys(r.device.serial if r.device else "(unknown)" for r in rep.runs
                              if r.status == RunStatus.succeeded and r.categories_ms is not None))


# ---- CLI glue (sme2-client submit --kit-config / status --kit-json) ----------------------------

# submit options the kit config decides, with their parser defaults: giving one with
# --kit-config would be a second, conflicting answer.
_CONFIG_DECIDES = {"sme2": ("--sme2", "both"), "threads": ("--threads", "1"), "iterations": ("--iterations", 20),
                   "warmup": ("--warmup", 2), "mode": ("--mode", "timing"), "core_mask": ("--core-mask", None)}


def cmd_submit(args) -> int:
    try:
        if args.model:
            raise KitConfigError(f"{args.model}: give either a model or --kit-config (the config names the model)")
        for attr, (flag, default) in _CONFIG_DECIDES.items():
            if getattr(args, attr, default) != default:
                raise KitConfigError(f"{flag} cannot be combined with --kit-config: the config's experiments decide it")
        inputs = Path(args.inputs) if getattr(args, "inputs", None) else None
        if inputs is not None and not inputs.is_file():
            raise KitConfigError(f"--inputs: {inputs} is not a file")
        sub = load_kit_config(args.kit_config)
        # What the kit config cannot say (where, under which name, power profile, sessions,
        # representative inputs, the method) still comes from the command line.
        data = sub.spec.model_dump()
        data.update(power_profile=args.power_profile, sessions=args.sessions)
        if getattr(args, "method", None) and "method" in data:
            data.update(method=args.method)
        if args.name:
            data.update(name=args.name)
        if args.label:
            data.update(labels={**sub.spec.labels, **dict(kv.split("=", 1) for kv in args.label)})
        if args.device:
            data.update(device=parse_selector(args.device).model_dump())
        elif sub.platforms and not args.any_platform:
            data.update(device={"platform": only_platform(sub.platforms)})
        spec = ExperimentSpec.model_validate(data)
    except KitConfigError as e:
        print(f"sme2-client: kit config {args.kit_config}: {e}", file=sys.stderr)
        return 2
    except (ValueError, ValidationError) as e:
        print(f"sme2-client: invalid spec: {e}", file=sys.stderr)
        return 2
    for line in sub.notes:
        print(f"sme2-client: kit config: {line}", file=sys.stderr)
    for line in sub.warnings:
        print(f"sme2-client: warning: kit config: {line}", file=sys.stderr)
    # the kit keeps the model's ETRecord beside it as <model>.pte.etrecord
    etrecord = Path(args.etrecord) if getattr(args, "etrecord", None) else etrecord_beside(sub.model)
    if etrecord is not None and not etrecord.is_file():
        print(f"sme2-client: {etrecord} is not a file", file=sys.stderr)
        return 2
    if not getattr(args, "etrecord", None):
        print(etrecord_note(sub.model, etrecord), file=sys.stderr)
    try:
        return submit_and_follow(args, sub.model, spec, inputs, origin=f" from {args.kit_config}", etrecord=etrecord)
    except FarmError as e:
        wanted = spec.device.platform if spec.device and not args.device else None
        if e.status != 422 or wanted is None or "matches selector" not in e.message:   # NoMatchingDevice
            raise
        # the farm has no device of the platform the config is written for: say so, not only the selector
        say_refusal(e)
        print(f"sme2-client: kit config {args.kit_config} is written for {PLATFORM_NAMES[wanted]} "
              f"({sub.platforms[wanted]}) and this farm has no {PLATFORM_NAMES[wanted]} device that can take it; "
              f"run it on a farm with one, or give --any-platform to run it on the devices here anyway", file=sys.stderr)
        return 1


def only_platform(platforms: dict[str, str]) -> str:
    """The one platform a config is written for; a config naming two cannot go to either alone."""
    if len(platforms) > 1:
        said = " and ".join(f"{PLATFORM_NAMES[p]} ({where})" for p, where in platforms.items())
        raise KitConfigError(f"it is written for {said}: split it, or choose devices with --device "
                             f"(or --any-platform: whatever devices match)")
    return next(iter(platforms))


def cmd_status_kit_json(client, experiment_id: int, arg: str) -> int:
    try:
        dest = summary_path(arg, Path.cwd())
    except KitError as e:
        print(f"sme2-client: {e}", file=sys.stderr)
        return 2
    rep = client.experiment(experiment_id, runs="full")  # the runs themselves, not a summary's run groups
    devices = devices_of(rep)
    if len(devices) > 1:  # the kit's summary is one run directory's: one device, never several summed
        print(f"sme2-client: experiment {experiment_id} ran on {len(devices)} devices ({', '.join(devices[:4])}"
              f"{' …' if len(devices) > 4 else ''}): the kit's analysis_summary.json is one device's; write one per "
              f"device with: sme2-client artifacts E{experiment_id} --kit -o DIR", file=sys.stderr)
        return 2
    traces, model = summary_from_experiment(rep, client.server)
    if not traces:
        states = ", ".join(f"run {r.id} {r.status}" for r in rep.runs) or "no runs"
        print(f"sme2-client: experiment {experiment_id} has no succeeded run to summarise ({states})", file=sys.stderr)
        return 1
    run_dir = str(dest.parent) if dest is not None else f"experiment {experiment_id}"
    write_summary(kit_summary(traces, run_dir=run_dir, model=model, program_memory=rep.program_memory), dest)
    return 0
