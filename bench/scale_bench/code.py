"""Which farm code a load runs on: this checkout's, or an earlier commit's (--before REV), so that
one run of the bench prints the before and the after side by side on the same machine, minutes
apart.

An earlier commit is checked out with `git worktree add --detach` into the bench's work dir, and
its packages are put first on PYTHONPATH through a folder of links laid out as its own
pyproject.toml maps them (`[tool.setuptools] package-dir`: sme2farm.server -> server/, ...). The
farm's processes (uvicorn, the Celery worker and beat) and its set-up (migrations, tokens) then
import that commit's code from this venv; the simulated agents, the poller and the figures stay
this checkout's, so both farms are driven and measured alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

from scale_bench.common import PY

REPO = Path(__file__).resolve().parents[2]

# Run in the farm's own code: migrate the database, make the admin and register tokens, print them.
_SETUP = """
import json, sys
from sme2farm.server.store.db import migrate, session_scope
from sme2farm.server.services import tokens
url, admin = sys.argv[1], sys.argv[2]
migrate(url)
with session_scope(url) as s:
    tokens.create(s, name="admin", scope="admin", token=admin)
    register = tokens.create(s, name="scale-bench", scope="register")
print(json.dumps({"register": register}))
"""


class FarmCode:
    """This checkout (rev None) or REV checked out under work; `env` runs a process on it."""

    def __init__(self, work: Path, rev: str | None):
        self.rev, self.root, self._paths = rev, REPO, ""
        if rev is None:
            self.label = "this checkout"
            return
        self.root = work / f"code-{rev}"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(self.root), rev],
                       check=True)
        sha = subprocess.run(["git", "-C", str(self.root), "rev-parse", "--short", "HEAD"], check=True,
                             capture_output=True, text=True).stdout.strip()
        self.label = f"{rev} ({sha})" if sha != rev else rev
        mapping = tomllib.loads((self.root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
        shim = work / f"shim-{rev}"
        for package, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
            link = shim.joinpath(*package.split("."))
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():   # a sub-package inside its parent's folder is reached through the parent
                link.symlink_to(self.root / folder, target_is_directory=True)
        self._paths = str(shim)

    def env(self, base: dict) -> dict:
        if not self._paths:
            return dict(base)
        return {**base, "PYTHONPATH": os.pathsep.join(p for p in (self._paths, base.get("PYTHONPATH", "")) if p)}

    def set_up(self, db_url: str, admin: str, env: dict) -> str:
        """Migrate db_url and create the tokens with this code; the register token."""
        out = subprocess.run([PY, "-c", _SETUP, db_url, admin], env=self.env(env), check=True, capture_output=True,
                             text=True, cwd=self.root)
        return json.loads(out.stdout.strip().splitlines()[-1])["register"]

    def close(self) -> None:
        if self.rev is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(self.root)], check=False)
