"""The `sme2-client` entry point: each command imports what it needs.

The offline `analyze` reads traces with numpy and sme2farm.analysis alone, so it starts without the
HTTP client, pydantic or the wire schemas; every other command goes through client/cli.py.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["analyze"]:
        from sme2farm.client import analyze_cmd
        try:
            code = analyze_cmd.main(argv[1:])
            sys.stdout.flush()
            return code
        except BrokenPipeError:  # `sme2-client analyze t.etdump | head`, as client/cli.py handles it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
    from sme2farm.client import cli
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
