"""`sme2-farm demo`: the farm started as `up` does, then a bundled example model exported (in a
child process) and profiled with SME2 off and on through the client, its report printed.

On a host without SME2 the host's SME2-on arm is unschedulable: it is measured with SME2 off
only. Where the SME2 emulator (`sme2-farm emulator install`, runners/emulator.py) and the arm64
cross-build (runners/cross.py) can be had, both seconds from a warm cache, the demo also serves
the emulated SME2 device (the qemu-arm64 driver) and runs the same model there with both arms, in
trace mode, and prints what emulation honestly shows: which operators took SME2 kernels, the
coverage, the numerics, and the kernel proof (the microkernels the emulator executed), labelled
emulated and without any speed figure. Where they cannot be had, one line says what was skipped
and why.

It ends on links that open signed in: each experiment's dashboard page with a read-only token in
the URL fragment (the page keeps it and takes it out of the address bar), minted for the demo
through the API; the previous demo's is revoked, so an old link does not stay a key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sme2farm.client.api import FarmClient
from sme2farm.client.common import wait_for
from sme2farm.client.render import experiment_text
from sme2farm.farm.processes import Farm
from sme2farm.farm.up import run_farm
from sme2farm.protocol import DeviceSelector, ExperimentSpec, TokenCreate, TokenCreated, TokenInfo

EMULATED_DRIVER = "qemu-arm64"
SKIPPED = "emulated SME2 device skipped"
LINKS = "Open in a browser, signed in"   # the line before the demo's dashboard links
DASHBOARD_TOKEN = "demo:dashboard"       # the read token those links carry


def host_has_sme2() -> bool:
    """Whether this host's own device has SME2, as its agent would detect it."""
    import platform

    if platform.system() == "Darwin":
        from sme2farm.agent.drivers.macos import MacDriver

        return MacDriver().sme2()[0]
    from sme2farm.agent.drivers.local import LocalDriver

    return LocalDriver().sme2()[0]


def prepare_emulated(manifest: Path | None, say=print) -> str:
    """Get the SME2 emulator and the arm64 runner (both idempotent); "" when the emulated SME2
    device can be served, else the reason it cannot, in one line."""
    from sme2farm.agent import emulator
    from sme2farm.runners import emulator as installer
    from sme2farm.runners.cross import build_platform
    from sme2farm.runners.tools import BuildError

    say("preparing the emulated SME2 device (the SME2 emulator and the arm64 runner) …")
    try:
        installer.install(emulator.cache_dir())
        path = emulator.installed()
        cpu = installer.probe(str(path)) if path is not None else None
    except installer.EmulatorError as e:
        return f"the SME2 emulator could not be had: {str(e).split('. ')[0]} (`sme2-farm emulator install` says more)"
    if cpu is None or not cpu.sme2:
        return "the installed emulator's CPU has no SME2 (`sme2-farm emulator status` says more)"
    try:
        build_platform("linux-arm64", manifest)
    except (BuildError, OSError, subprocess.SubprocessError) as e:
        return (f"the arm64 runner could not be cross-built: {str(e).splitlines()[0][:300]} "
                "(`sme2-farm build-runner --platform linux-arm64` says more)")
    return ""


def _names(ops: list[str], n: int = 4) -> str:
    return ", ".join(ops[:n]) + (f" and {len(ops) - n} more" if len(ops) > n else "")


def _plain(value):
    """A report section as plain JSON data (what analysis/wording.py reads), whether the client
    hands it over typed (a pydantic model) or as the dict the analysis wrote."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def emulated_text(exp) -> str:
    """What the emulated SME2 device showed, per arm, without a speed figure."""
    from sme2farm.analysis.wording import emulated_headline, numerics_line

    runs = {r.sme2: r for r in exp.runs}
    dev = next((r.device for r in exp.runs if r.device is not None), None)
    who = dev.emulator if dev is not None and dev.emulator else "an emulator"
    out = [f"Emulated SME2 device, experiment {exp.id}: {exp.status} (emulated by {who}: it proves which kernels "
           "ran and what they computed, never speed; no timing is shown)"]
    for arm in ("on", "off"):
        r = runs.get(arm)
        if r is None:
            continue
        out.append(f"  SME2 {arm}: {r.status}" + (f" — {r.reason}" if r.reason else "")
                   + (f"  (runner {r.runner.id})" if r.runner else ""))
        if r.status != "succeeded":
            continue
        by_path: dict[str, list[str]] = {}
        for o in r.operators or []:
            by_path.setdefault(o.kernel_path or "?", []).append(o.name)
        if by_path.get("SME2"):
            out.append(f"    operators on SME2 kernels: {_names(by_path['SME2'])}")
        others = {p: names for p, names in by_path.items() if p != "SME2"}
        if others:
            out.append("    other operators: " + "; ".join(f"{p}: {_names(n, 3)}" for p, n in sorted(others.items())))
        share = r.kernel_paths.coverage.share if r.kernel_paths is not None else None
        if share is not None:   # a share of the emulator's time, said as a share only: no time is shown
            out.append(f"    SME2 coverage {100 * share:.0f}% of Convolution/GEMM (a share of the emulator's time)")
        k = r.kernels
        if k is not None and k.status == "ok":
            entries = {e.name: str(e.isa or "").upper() for kind in (k.by_kind or {}).values() for e in kind}
            sme = sorted((n for n, isa in entries.items() if isa in ("SME2", "SME")),
                         key=lambda n: (entries[n] != "SME2", n))
            proof = (f"executed {len(sme)} SME/SME2 microkernel(s): {_names(sme, 3)}" if sme else
                     f"executed no SME/SME2 microkernel ({len(entries)} other)")
            out.append(f"    kernel proof ({k.source or 'kernel log'}): {proof}")
        elif k is not None:
            out.append(f"    kernel proof: {k.status}")
    for c in _plain(list(exp.comparisons)):
        out.append(f"  {emulated_headline(c)}")
        if numerics_line(c):
            out.append(f"  {numerics_line(c)}")
    return "\n".join(out)


def dashboard_token(client: FarmClient) -> str:
    """A fresh read-only token for the demo's links, the admin user's (so it reads what the demo
    submitted, SME2_READS_TEAM_ONLY or not); the previous demo's is revoked first."""
    listed = client.http.get("/tokens", params={"include_revoked": "false"})
    listed.raise_for_status()
    for row in map(TokenInfo.model_validate, listed.json()):
        if row.name == DASHBOARD_TOKEN and not row.revoked:
            client.http.delete(f"/tokens/{row.id}").raise_for_status()
    made = client.http.post("/tokens", json=TokenCreate(name=DASHBOARD_TOKEN, scope="read", user="admin")
                            .model_dump(exclude_none=True))
    made.raise_for_status()
    return TokenCreated.model_validate(made.json()).token


def links_text(url: str, token: str, experiments: list[tuple[int, str]]) -> str:
    """The demo's last lines: a signed-in dashboard link per experiment (id, what it is), then the list."""
    out = [f"{LINKS} (a read-only token; the next `sme2-farm demo` revokes it):"]
    out += [f"  experiment {eid}, {what}: {url}/#/experiments/{eid}?token={token}" for eid, what in experiments]
    out.append(f"  every experiment: {url}/#token={token}")
    ids = " and ".join(f"sme2-client status {eid}" for eid, _ in experiments)
    out.append(f"From the command line (SME2_SERVER and SME2_TOKEN as exported above): {ids}")
    return "\n".join(out)


def _where(exp) -> str:
    devices = sorted({r.device.serial for r in exp.runs if r.device is not None})
    return f"on {', '.join(devices)}" if devices else "no device ran it"


def cmd_demo(args) -> int:
    emulated = ""   # "": not asked (the host has SME2, or --no-emulated); "ready"; else why skipped
    if not getattr(args, "no_emulated", False) and not host_has_sme2():
        manifest = Path(args.manifest).resolve() if args.manifest else None
        why = prepare_emulated(manifest)
        if why:
            emulated = why
        else:
            emulated = "ready"
            drivers = [d for d in args.drivers.split(",") if d]
            if EMULATED_DRIVER not in drivers:
                args.drivers = ",".join([*drivers, EMULATED_DRIVER])

    def demo(farm: Farm) -> int:
        model = farm.settings.data_dir / "examples" / f"{args.model}.pte"
        if not model.exists():
            model.parent.mkdir(parents=True, exist_ok=True)
            print(f"exporting the bundled example model {args.model!r} …", flush=True)
            # In a child process: torch stays out of the supervisor, and its import chatter out of the demo.
            done = subprocess.run([sys.executable, "-m", "sme2farm.runners.examples", args.model, str(model)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"exporting {args.model} failed:\n{done.stderr[-3000:]}")
        client = FarmClient(farm.url, farm.token)
        devices = client.devices()
        for d in devices:
            if d.state == "unhealthy":
                print(f"device {d.serial} is unhealthy and gets no run: {d.state_reason or 'its agent says so'}",
                      flush=True)
        hardware = [d for d in devices if not d.emulator]
        # The host's own measurement: the hardware devices only (the emulated one has its own section).
        selector = DeviceSelector(serial=hardware[0].serial) if emulated == "ready" and len(hardware) == 1 else None
        rep = client.submit(model, ExperimentSpec(sme2="both", threads=[1], iterations=args.iterations, warmup=2,
                                                  name=f"demo {args.model}", device=selector))
        print(f"submitted experiment {rep.id}: sme2-client submit {model.name} --sme2 both --wait", flush=True)
        wait_for(client, rep.id, quiet=False, timeout=600, check=farm.poll)
        print()
        host = client.experiment(rep.id)
        print(experiment_text(host))
        made = [(rep.id, f"{host.name}, {_where(host)}")]
        if emulated == "ready":
            emu = client.submit(model, ExperimentSpec(sme2="both", threads=[1], iterations=3, warmup=1, mode="trace",
                                                      name=f"demo {args.model} (emulated SME2)",
                                                      device=DeviceSelector(tags=["emulated"], sme2=True)))
            print(f"submitted experiment {emu.id} on the emulated SME2 device: sme2-client submit {model.name} "
                  f"--sme2 both --mode trace --device tags=emulated --wait", flush=True)
            wait_for(client, emu.id, quiet=False, timeout=900, check=farm.poll)
            print()
            on_emulator = client.experiment(emu.id)
            print(emulated_text(on_emulator))
            made.append((emu.id, f"{on_emulator.name}, {_where(on_emulator)} (emulated: no timing)"))
        elif emulated:
            print(f"{SKIPPED}: {emulated}")
        print()
        print(links_text(farm.url, dashboard_token(client), made), flush=True)
        return 0

    return run_farm(args, then=demo)
