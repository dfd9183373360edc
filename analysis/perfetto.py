"""One Execute iteration of an ETDump as a Chrome/Perfetto trace (trace-event JSON).

An iteration draws at most MAX_EVENTS events: a crafted trace can point one Execute block at a
million copies of one event, which as JSON is some 160 bytes each. :func:`perfetto_json` writes
the text directly, one formatted line per event, without building a dict for each."""

from __future__ import annotations

import json

import numpy as np

from .categories import category_of
from .etdump import KIND_PROFILE, EtdumpError, Events, read_etdump
from .report import TICKS_PER_MS

MAX_EVENTS = 200_000  # profile events in the drawn iteration; a real model's iteration has a few thousand
_CONTAINERS = ("Method::execute", "DELEGATE_CALL", "OPERATOR_CALL")


def to_perfetto(etdump: bytes | Events, iteration: int = 0) -> dict:
    """Chrome trace-event JSON (opens in ui.perfetto.dev / chrome://tracing) of one Execute
    iteration: complete ("X") events in µs relative to the iteration's first event. Delegate
    operator events carry synthetic starts (XNNPACK times each op, not its start), so they
    are laid end to end inside their DELEGATE_CALL."""
    return json.loads(perfetto_json(etdump, iteration))


def drawn_events(ev: Events, iteration: int = 0) -> np.ndarray:
    """The indices of the profile events one Execute iteration draws. EtdumpError where there is
    no Execute block or the iteration holds more than MAX_EVENTS (ingest asks this up front, so a
    stored run's perfetto.json can always be drawn on request)."""
    runs = [i for i, n in enumerate(ev.run_names) if n == "Execute"]
    if not runs:
        raise EtdumpError("no Execute block in this ETDump: nothing to draw")
    if not -len(runs) <= iteration < len(runs):
        raise IndexError(f"iteration {iteration} out of range (trace has {len(runs)})")
    sel = np.flatnonzero((ev.run == runs[iteration]) & (ev.kind == KIND_PROFILE))
    if sel.size > MAX_EVENTS:
        raise EtdumpError(f"iteration {iteration} holds {sel.size} profile events, past the Perfetto export's limit "
                          f"of {MAX_EVENTS}")
    return sel


def perfetto_json(etdump: bytes | Events, iteration: int = 0) -> str:
    """:func:`to_perfetto`'s trace as JSON text. An iteration of more than MAX_EVENTS profile
    events raises EtdumpError naming the limit."""
    ev = etdump if isinstance(etdump, Events) else read_etdump(etdump)
    sel = drawn_events(ev, iteration)
    dur = ev.duration[sel]
    start = ev.start[sel].astype(np.int64)
    base = int(start.min()) if sel.size else 0
    # parents first at equal starts so viewers nest children correctly
    order = np.lexsort((-dur, start))
    idx = sel[order]
    ts = ((start[order] - base) / 1000.0).tolist()
    durs = dur[order]
    dur_us = (durs / 1000.0).tolist()
    dur_ms = (durs / TICKS_PER_MS).tolist()
    keys = zip(ev.dstr[idx].tolist(), ev.dint[idx].tolist(), ev.name[idx].tolist())
    head: dict[tuple[int, int, int], tuple[str, str]] = {}  # the fields an event's name decides, as JSON, per distinct name
    lines = ['{"traceEvents": [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ExecuTorch"}}',
             '{"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": '
             + json.dumps(f"iteration {iteration}") + '}}']
    for key, t, d, ms, instr in zip(keys, ts, dur_us, dur_ms, ev.instr[idx].tolist()):
        fields = head.get(key)
        if fields is None:
            dstr_id, dint, name_id = key
            dstr = ev.strings[dstr_id] if dstr_id >= 0 else ""
            name = dstr if dstr else (str(dint) if dint != -1 else (ev.strings[name_id] if name_id >= 0 else "?"))
            cat = "runtime" if name in _CONTAINERS else category_of(name)
            delegated = "true" if (bool(dstr) or dint != -1) else "false"
            fields = head[key] = (f'{{"name": {json.dumps(name)}, "ph": "X", "pid": 1, "tid": 1, '
                                  f'"cat": {json.dumps(cat)}, "ts": ', delegated)
        lines.append(f'{fields[0]}{t!r}, "dur": {d!r}, "args": {{"instruction_id": {instr}, '
                     f'"delegated": {fields[1]}, "duration_ms": {ms!r}}}}}')
    lines[-1] += (f'], "displayTimeUnit": "ms", "otherData": {{"iteration": {iteration}, '
                  f'"n_iterations": {ev.run_names.count("Execute")}}}}}')
    return ", ".join(lines)
