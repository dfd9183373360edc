"""sme2-agent: serve the devices plugged into this host, or list them."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
from pathlib import Path

from sme2farm import logs
from sme2farm.agent import drivers as driver_registry
from sme2farm.agent.drivers import DRIVER_NAMES, DRIVERS
from sme2farm.agent.api import AgentApi, ServerTooOld, Unauthorized
from sme2farm.agent.config import agent_settings
from sme2farm.agent.loop import Agent
from sme2farm.protocol import DEFAULT_SERVER_URL, abbreviated
from sme2farm.runners.catalog import Catalog


def _drivers(args) -> list:
    names = args.drivers.split(",") if args.drivers else None
    return driver_registry.load(names, adb_port=args.adb_port)


def cmd_devices(args) -> int:
    agent = Agent(api=None, drivers=_drivers(args), catalog=Catalog.load(args.manifest), work_dir=Path(args.work_dir) if args.work_dir else None)
    devices = agent.discover()
    if args.json:
        print(json.dumps([d.model_dump(mode="json") for d in devices], indent=2))
        return 0
    if not devices:
        print("no devices")
    for d in devices:
        sme2 = "SME2" if d.sme2 else "no SME2"
        print(f"{d.serial:<28} {d.platform:<8} {abbreviated(d.model, 32):<32} {d.cpu_cores:>3} cores  {d.abi:<10} "
              f"{sme2:<8} {d.state}  ({d.sme2_evidence})")
    return 0


def cmd_check(args) -> int:
    """`sme2-agent check`: every device (or --device SERIAL) checked here, no server needed; exit 0
    only when every check of every device passed (agent/check.py)."""
    from sme2farm.agent import check

    work_dir = args.work_dir or agent_settings().agent_work_dir
    base = Path(work_dir) if work_dir else Path(tempfile.gettempdir()) / "sme2-agent"
    devices = check.check_all(_drivers(args), Catalog.load(args.manifest), base / "check", args.device)
    if args.json:
        print(json.dumps({"ok": bool(devices) and all(d.ok for d in devices),
                          "devices": [d.as_json() for d in devices]}, indent=2))
    elif devices:
        print(check.render(devices))
    if not devices:
        where = f"device {args.device}" if args.device else "any device"
        print(f"sme2-agent check: found no {where} (drivers: {args.drivers or ','.join(driver_registry.default_names())}); "
              "`sme2-agent devices` lists what this host sees", file=sys.stderr)
        return 1
    return 0 if all(d.ok for d in devices) else 1


def cmd_run(args) -> int:
    settings = agent_settings()
    token = args.token or (settings.token.get_secret_value() if settings.token else None)
    if not token:
        print("sme2-agent: a registration token is needed (--token or SME2_AGENT_TOKEN)", file=sys.stderr)
        return 2
    work_dir = args.work_dir or settings.agent_work_dir
    agent = Agent(AgentApi(args.server or settings.server, token), _drivers(args), Catalog.load(args.manifest),
                  name=args.name, work_dir=Path(work_dir) if work_dir else None,
                  check_devices=settings.agent_check and not args.no_check)
    def terminate(*_):
        # Stop now, not after the current long-poll (up to 20 s): a supervisor waits on this.
        agent.stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        agent.serve()
    except KeyboardInterrupt:
        agent.stop.set()
    except (Unauthorized, ServerTooOld) as e:  # retrying cannot help
        print(f"sme2-agent: {e}", file=sys.stderr)
        return 3
    return 0


def host_options(parser: argparse.ArgumentParser, *, given_only: bool = False) -> None:
    """--drivers, --adb-port, --manifest, --work-dir, taken before the command or after it. After it
    (`given_only`) an option not given sets nothing, so one given before the command stands."""
    unset = {"default": argparse.SUPPRESS} if given_only else {"default": None}
    kinds = "; ".join(f"{name}: {what}" for name, what in DRIVERS.items())
    parser.add_argument("--drivers", **unset,
                        help=f"comma-separated, from {','.join(DRIVER_NAMES)} (default: "
                             f"{','.join(driver_registry.default_names())}). They drive: {kinds}")
    parser.add_argument("--adb-port", type=int, **unset,
                        help="adb server port (default: ANDROID_ADB_SERVER_PORT or 5037)")
    parser.add_argument("--manifest", **unset,
                        help="runner manifest (default: SME2_RUNNER_MANIFEST or runners/build/manifest.json)")
    parser.add_argument("--work-dir", **unset,
                        help="where runs are staged (default: SME2_AGENT_WORK_DIR, else <temp dir>/sme2-agent)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sme2-agent", description="Serve this host's devices to an SME2 farm.")
    host_options(p)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)
    each = argparse.ArgumentParser(add_help=False)   # the same options after the command: `check --drivers qemu-arm64`
    host_options(each, given_only=True)
    d = sub.add_parser("devices", parents=[each], help="list the devices this agent would serve")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_devices)
    c = sub.add_parser("check", parents=[each], epilog="e.g. sme2-agent check --drivers local,qemu-arm64: this "
                                                       "host and the emulated SME2 device",
                       help="check each device before it takes work: SME2 detection, runner builds, the bundled "
                            "example through both arms, hygiene readings (no server needed; exit 0 only when every "
                            "check passes)")
    c.add_argument("--device", metavar="SERIAL", help="check this device only")
    c.add_argument("--json", action="store_true", help="a machine-readable document")
    c.set_defaults(fn=cmd_check)
    r = sub.add_parser("run", parents=[each], help="register with the server and serve runs until stopped")
    r.add_argument("--server", default=None, help="the farm's URL (default: SME2_SERVER, else "
                                                  f"{DEFAULT_SERVER_URL})")
    r.add_argument("--token", default=None)
    r.add_argument("--name", default=None)
    r.add_argument("--no-check", action="store_true",
                   help="serve devices without checking them first (default: each device is checked as "
                        "`sme2-agent check` does when first seen; one that fails is reported unhealthy; "
                        "SME2_AGENT_CHECK=0 does the same)")
    r.set_defaults(fn=cmd_run)
    args = p.parse_args(argv)
    logs.configure("agent", logging.DEBUG if args.verbose else logging.INFO)  # JSON lines unless on a terminal
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
