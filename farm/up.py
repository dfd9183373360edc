"""`sme2-farm up`: the farm on this machine, from the checks that stop it before it starts to the
lines that say it is up, until Ctrl-C or SIGTERM stops it. `demo` runs the same with its demo."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from sme2farm.farm.preflight import data_dir_problem, port_problem, settings_for
from sme2farm.farm.processes import Farm
from sme2farm.farm.runners_cmd import ensure_runner


def token_hint(token: str) -> str:
    """Enough to tell tokens apart, never enough to use one."""
    return token[:9] + "…"


def run_farm(args, then=None) -> int:
    settings = settings_for(args.data_dir)
    manifest = Path(args.manifest).resolve() if args.manifest else None
    # What stops a farm before it starts, each told in one line (exit 1) instead of a child's exit
    # code or a traceback: the data dir, the port, the local runner's build (its compiler).
    try:
        problem = data_dir_problem(settings.data_dir) or port_problem(args.host, args.port)
        if problem:
            raise RuntimeError(problem)
        ensure_runner(manifest)
    except RuntimeError as e:
        print(f"sme2-farm: {e}", file=sys.stderr)
        return 1
    farm = Farm(settings, args.host, args.port, args.drivers, manifest, ready_timeout=args.ready_timeout)
    # Ctrl-C and SIGTERM both stop the farm cleanly. SIGINT is set explicitly because a process
    # started from a background shell inherits it ignored, and Ctrl-C would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        farm.start()
        print(f"devices: {', '.join(farm.devices)}", flush=True)
        print(f"farm up: API {farm.url}  docs {farm.url}/docs  dashboard {farm.url}/", flush=True)
        token_file = farm.data_dir / "token"
        # Never printed in full: terminal scrollback and CI logs are read by more people than the file.
        print(f"admin token: in {token_file} (mode 0600; {token_hint(farm.token)})", flush=True)
        print(f"  export SME2_SERVER={farm.url} SME2_TOKEN=$(cat {token_file})", flush=True)
        if then is not None:
            code = then(farm)
            if args.exit:
                return code
        print("Ctrl-C stops the farm.", flush=True)
        farm.serve_forever()
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    except RuntimeError as e:
        print(f"sme2-farm: {e}", file=sys.stderr)
        return 1
    finally:
        farm.stop()
    return 0


def cmd_up(args) -> int:
    return run_farm(args)
