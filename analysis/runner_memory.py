"""The runner's memory figures (runner --memory_file, protocol.MEMORY) read into the report's
``memory``: peak resident memory and what the runtime itself allocated.

The file is one JSON object written by runners/runner.cpp at exit:

* ``peak_rss_bytes``: the runner's peak resident memory at exit, in bytes, read where
  ``rss_source`` says: ``/proc/self/status VmHWM`` on Linux and Android (the process image's own
  high-water mark: getrusage's ru_maxrss is carried across execve there, so it would count the
  parent that started the runner), getrusage's ru_maxrss elsewhere (macOS: bytes);
  ``peak_rss_after_load_bytes`` the same after load_method, so the execution's own growth is the
  difference. Under an emulator the process measured is the emulator's.
* ``planned_bytes`` (and ``planned_buffers_bytes`` per arena): the memory-planned buffers the
  runner allocated; ``method_allocator_bytes`` (and ``..._allocations``): what load_method asked
  the method allocator for; ``temp_allocator_peak_bytes``: the most scratch one kernel call held.
* ``runtime_allocated_bytes`` = planned + method allocator + temp peak. A delegate's own mallocs
  (XNNPACK's packed weights and workspace) are not in it, only in the peak RSS.

An agent uploads the file, so it is not trusted: anything but an object of known keys with
non-negative integers (or null) is refused with :class:`MemoryFileError`.
"""

from __future__ import annotations

import json

from .types import RunnerMemory

__all__ = ["MemoryFileError", "MAX_BYTES", "read_memory", "read_memory_section", "INTEGER_KEYS"]

MAX_BYTES = 64 << 10
INTEGER_KEYS = ("peak_rss_bytes", "peak_rss_after_load_bytes", "planned_bytes", "method_allocator_bytes",
                "method_allocator_allocations", "temp_allocator_peak_bytes", "temp_allocator_allocations",
                "runtime_allocated_bytes")
_MAX_VALUE = 2**63 - 1
_MAX_ARENAS = 1024


class MemoryFileError(ValueError):
    """The memory file is not what the runner writes."""


def _count(value, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_VALUE:
        raise MemoryFileError(f"{key} must be a non-negative integer or null, got {str(value)[:40]}")
    return value


def read_memory_section(data: bytes) -> RunnerMemory:
    """The report's ``memory`` section from the runner's memory file."""
    if len(data) > MAX_BYTES:
        raise MemoryFileError(f"the memory file is {len(data)} bytes, over {MAX_BYTES}")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise MemoryFileError(f"the memory file is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise MemoryFileError("the memory file is not a JSON object")
    counts = {k: _count(raw.get(k), k) for k in INTEGER_KEYS}
    arenas = raw.get("planned_buffers_bytes", [])
    if not isinstance(arenas, list) or len(arenas) > _MAX_ARENAS:
        raise MemoryFileError("planned_buffers_bytes must be a list of at most 1024 sizes")
    source = raw.get("rss_source")
    memory = RunnerMemory(**counts, planned_buffers_bytes=[_count(v, "planned_buffers_bytes") for v in arenas],
                          rss_source=source[:100] if isinstance(source, str) else None,
                          execution_rss_growth_bytes=None)
    peak, after_load = memory.peak_rss_bytes, memory.peak_rss_after_load_bytes
    if peak is not None and after_load is not None:
        memory.execution_rss_growth_bytes = max(peak - after_load, 0)
    return memory


def read_memory(data: bytes) -> dict:
    """read_memory_section() as the JSON the report stores."""
    return read_memory_section(data).to_dict()
