"""`sme2-farm runners`: every build the runner catalog holds, as JSON or a table."""

from __future__ import annotations

import json
from dataclasses import asdict

from sme2farm.runners.catalog import Catalog


def rows(catalog: Catalog) -> list[dict]:
    """One dict per build: every RunnerBuild field, with `path` resolved to where the file is and
    `present` saying whether it is there (a manifest can outlive a deleted build folder)."""
    out = []
    for b in catalog.builds:
        p = catalog.resolve(b)
        out.append({**asdict(b), "path": str(p), "present": p.is_file()})
    return out


def table(items: list[dict]) -> str:
    head = ("ID", "PLATFORM", "SME2", "FLAVOUR", "ORIGIN", "EXECUTORCH", "SHA256", "RUNS WITH", "PATH")
    lines = [head]
    for r in items:
        how = [f"{k}={v}" for k, v in sorted(r.get("env", {}).items())]
        if r.get("loader"):
            how.append(f"loader {r['loader']}")
        lines.append((r["id"], r["platform"], r["sme2"], r["flavour"], r.get("origin", ""),
                      r.get("executorch_version", ""), r["sha256"][:12], " ".join(how) or "-",
                      r["path"] + ("" if r.get("present", True) else "  (missing)")))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + str(row[-1]) for row in lines)


def render(catalog: Catalog, as_json: bool) -> str:
    items = rows(catalog)
    if as_json:
        return json.dumps(items, indent=2)
    if not items:
        return f"no runner builds registered in {catalog.manifest}"
    return table(items) + f"\n\n{len(items)} build(s) in {catalog.manifest}"
