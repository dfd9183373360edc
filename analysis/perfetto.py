"""One Execute iteration of an ETDump as a Chrome/Perfetto trace (trace-event JSON)."""

from __future__ import annotations

import numpy as np

from .categories import category_of
from .etdump import KIND_PROFILE, EtdumpError, Events, read_etdump
from .report import TICKS_PER_MS


def to_perfetto(etdump: bytes | Events, iteration: int = 0) -> dict:
    """Chrome trace-event JSON (opens in ui.perfetto.dev / chrome://tracing) of one Execute
    iteration: complete ("X") events in µs relative to the iteration's first event. Delegate
    operator events carry synthetic starts (XNNPACK times each op, not its start), so they
    are laid end to end inside their DELEGATE_CALL."""
    ev = etdump if isinstance(etdump, Events) else read_etdump(etdump)
    runs = [i for i, n in enumerate(ev.run_names) if n == "Execute"]
    if not runs:
        raise EtdumpError("no Execute block in this ETDump: nothing to draw")
    if not -len(runs) <= iteration < len(runs):
        raise IndexError(f"iteration {iteration} out of range (trace has {len(runs)})")
    run = runs[iteration]
    sel = np.flatnonzero((ev.run == run) & (ev.kind == KIND_PROFILE))
    dur = ev.duration[sel]
    start = ev.start[sel].astype(np.int64)
    base = int(start.min()) if sel.size else 0
    # parents first at equal starts so viewers nest children correctly
    order = np.lexsort((-dur, start))
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ExecuTorch"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": f"iteration {iteration}"}},
    ]
    for j in order.tolist():
        i = int(sel[j])
        dstr = ev.strings[ev.dstr[i]] if ev.dstr[i] >= 0 else ""
        delegated = bool(dstr) or bool(ev.dint[i] != -1)
        name = dstr if dstr else (str(int(ev.dint[i])) if ev.dint[i] != -1 else
                                  (ev.strings[ev.name[i]] if ev.name[i] >= 0 else "?"))
        container = name in ("Method::execute", "DELEGATE_CALL", "OPERATOR_CALL")
        events.append({
            "name": name, "ph": "X", "pid": 1, "tid": 1,
            "cat": "runtime" if container else category_of(name),
            "ts": (int(start[j]) - base) / 1000.0,
            "dur": int(dur[j]) / 1000.0,
            "args": {"instruction_id": int(ev.instr[i]), "delegated": delegated,
                     "duration_ms": int(dur[j]) / TICKS_PER_MS},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"iteration": iteration, "n_iterations": len(runs)}}
