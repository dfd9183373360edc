"""What every runner build shares: its sources, the binary's name, the error a build raises, the
installed executorch wheel, the pip `cmake` and a command run into the build's log.

Standard library only at import (the agent imports runners/elf.py, which raises BuildError);
executorch and cmake are imported when a build asks for them: neither is installed on an agent.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SOURCES = ("runner.cpp", "CMakeLists.txt", "sme2_hide.c", "sme2_hide.h")
BINARY_NAME = "sme2farm_runner"


class BuildError(RuntimeError):
    pass


def executorch_package() -> tuple[Path, str, str]:
    """(package dir, version, git commit) of the installed executorch wheel."""
    try:
        import executorch  # lazy: the [export] extra, absent on agents
        import executorch.version as v
    except ImportError as e:
        raise BuildError("executorch is not installed: pip install 'sme2-farm[export]'") from e
    # executorch is a namespace package: no __file__, its directory comes from __path__.
    return Path(list(executorch.__path__)[0]), v.__version__, v.git_version


def cmake_binary() -> str:
    """The pip cmake's executable (the wheel's imported targets need CMake >= 3.28)."""
    try:
        import cmake  # lazy: a build-only dependency
    except ImportError as e:
        raise BuildError("the pip cmake package is missing: pip install 'cmake>=3.28'") from e
    return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")


def run_logged(argv: list[str], log: Path) -> None:
    """Run `argv` with its output appended to `log`; a failure raises BuildError with the log's tail."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise BuildError(f"{argv[0]} {argv[1]} failed (exit {r.returncode}); log {log}:\n{tail}")
