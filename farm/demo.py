"""`sme2-farm demo`: the farm started as `up` does, then a bundled example model exported (in a
child process) and profiled with SME2 off and on through the client, its report printed."""

from __future__ import annotations

import subprocess
import sys

from sme2farm.client.api import FarmClient
from sme2farm.client.common import wait_for
from sme2farm.client.render import experiment_text
from sme2farm.farm.processes import Farm
from sme2farm.farm.up import run_farm
from sme2farm.protocol import ExperimentSpec


def cmd_demo(args) -> int:
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
        rep = client.submit(model, ExperimentSpec(sme2="both", threads=[1], iterations=args.iterations, warmup=2,
                                                  name=f"demo {args.model}"))
        print(f"submitted experiment {rep.id}: sme2-client submit {model.name} --sme2 both --wait", flush=True)
        wait_for(client, rep.id, quiet=False, timeout=600, check=farm.poll)
        print()
        print(experiment_text(client.experiment(rep.id)))
        print(f"report JSON: {farm.url}/experiments/{rep.id}   dashboard: {farm.url}/", flush=True)
        return 0

    return run_farm(args, then=demo)
