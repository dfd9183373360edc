"""Memory compared: two arms' runner figures (peak RSS, what the runtime allocated: the report's
``memory``, analysis/runner_memory.py) and two programs' planned memory (ProgramMemory dicts,
analysis/pte.py), in numbers and words.

Planned memory and weights are read from the program: the same program gives the same bytes,
so a change is exact and needs no statistics ("planned memory +12%"). Peak RSS is measured per
run: it is given per arm as the median over the arm's runs, with its runs' range.
"""

from __future__ import annotations

import statistics

__all__ = ["arm_memory", "runs_compared", "planned_compared", "change_text", "fmt_bytes", "point_memory",
           "memory_changes", "DETERMINISTIC"]

RSS_KEYS = ("peak_rss_bytes", "runtime_allocated_bytes", "execution_rss_growth_bytes")
PLANNED_KEYS = ("planned_bytes", "weights_bytes")
# What the same program on the same runtime build gives exactly the same of, run after run: a
# change in a series is a change, flagged without statistics. Peak RSS is measured, so not here.
DETERMINISTIC = (("planned_bytes", "planned memory"), ("weights_bytes", "weights"),
                 ("runtime_allocated_bytes", "runtime allocated memory"))


def fmt_bytes(n) -> str:
    if n is None:
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def change_text(before: int | None, after: int | None) -> str:
    """'+12.0%', '-3.1%', 'unchanged', or '' when either side is unknown."""
    if before is None or after is None:
        return ""
    if before == after:
        return "unchanged"
    if before == 0:
        return f"+{fmt_bytes(after)} (from none)"
    return f"{100 * (after - before) / before:+.1f}%"


def arm_memory(arm) -> dict | None:
    """One arm's runner memory: a report, or a list of reports (one per run). Per key the median
    over the runs that recorded it, its min and max, and how many runs did; None when none did."""
    reports = [r for r in (arm if isinstance(arm, (list, tuple)) else [arm]) if r]
    memories = [r.get("memory") for r in reports if isinstance(r.get("memory"), dict)]
    if not memories:
        return None
    out: dict = {"runs": len(memories)}
    for k in RSS_KEYS:
        vals = [m[k] for m in memories if isinstance(m.get(k), int)]
        out[k] = int(statistics.median(vals)) if vals else None
        out[f"{k}_range"] = [min(vals), max(vals)] if vals else None
    return out


def runs_compared(baseline, candidate, labels: tuple[str, str] = ("baseline", "candidate"),
                  emulator: str | None = None) -> dict | None:
    """Both arms' runner memory and the change of the medians; None when neither recorded any.
    Under an emulator the process measured is the emulator's: the sentence says so."""
    b, c = arm_memory(baseline), arm_memory(candidate)
    if b is None and c is None:
        return None
    pick = lambda m, k: (m or {}).get(k)  # noqa: E731
    parts = []
    for key, name in (("peak_rss_bytes", "peak RSS"), ("runtime_allocated_bytes", "runtime allocated")):
        bv, cv = pick(b, key), pick(c, key)
        if bv is None and cv is None:
            continue
        change = change_text(bv, cv)
        parts.append(f"{name} {labels[0]} {fmt_bytes(bv)}, {labels[1]} {fmt_bytes(cv)}"
                     + (f" ({change})" if change else ""))
    sentence = "Memory: " + "; ".join(parts) + " (median over runs)." if parts else ""
    if emulator and sentence:
        sentence += f" Under emulation ({emulator}) the RSS is the emulator's process, not the program's alone."
    return {"baseline": b, "candidate": c,
            "peak_rss_change": _ratio(pick(b, "peak_rss_bytes"), pick(c, "peak_rss_bytes")),
            "sentence": sentence}


def planned_compared(baseline: dict | None, candidate: dict | None,
                     labels: tuple[str, str] = ("baseline", "candidate")) -> dict | None:
    """Two programs' planned memory (protocol.ProgramMemory dicts): exact changes, no statistics."""
    if not baseline and not candidate:
        return None
    changes = {k: _ratio((baseline or {}).get(k), (candidate or {}).get(k)) for k in PLANNED_KEYS}
    parts = []
    for k, name in (("planned_bytes", "planned memory"), ("weights_bytes", "weights")):
        bv, cv = (baseline or {}).get(k), (candidate or {}).get(k)
        change = change_text(bv, cv)
        parts.append(f"{name} {change or 'not recorded on one side'}"
                     + (f" ({fmt_bytes(bv)} -> {fmt_bytes(cv)})" if change and change != "unchanged" else
                        f" ({fmt_bytes(bv)})" if change == "unchanged" else ""))
    return {"baseline": baseline, "candidate": candidate, "change": changes,
            "sentence": f"{labels[0]} -> {labels[1]}: " + "; ".join(parts) + "."}


def _ratio(before, after) -> float | None:
    """after / before - 1 (a fraction), None when either is unknown or before is 0."""
    if before is None or after is None or before == 0:
        return None
    return after / before - 1.0


def point_memory(program: dict | None, reports: list[dict]) -> dict | None:
    """A suite point's memory: the program's planned bytes and weights (a ProgramMemory dict) and
    the runs' runtime allocation and peak RSS (medians over the runs that recorded them)."""
    arm = arm_memory(reports) or {}
    out = {"planned_bytes": (program or {}).get("planned_bytes"), "weights_bytes": (program or {}).get("weights_bytes"),
           "runtime_allocated_bytes": arm.get("runtime_allocated_bytes"), "peak_rss_bytes": arm.get("peak_rss_bytes")}
    return out if any(v is not None for v in out.values()) else None


def memory_changes(points: list[dict | None], labels: list[str]) -> list[dict]:
    """Every point of a series (memory dicts in order, None where not recorded) whose
    deterministic figure differs from the last point that recorded it: {point_index, since_index,
    what, before, after, change (a fraction), sentence}. `labels` name the points in words."""
    out = []
    for key, name in DETERMINISTIC:
        last: tuple[int, int] | None = None
        for i, m in enumerate(points):
            value = (m or {}).get(key)
            if value is None:
                continue
            if last is not None and value != last[1]:
                out.append({"point_index": i, "since_index": last[0], "what": key, "before": last[1], "after": value,
                            "change": _ratio(last[1], value),
                            "sentence": f"{name} {change_text(last[1], value)} since {labels[last[0]]}: "
                                        f"{fmt_bytes(last[1])} -> {fmt_bytes(value)}"})
            last = (i, value)
    return sorted(out, key=lambda c: (c["point_index"], c["what"]))
