"""Peak extra memory of a block of code, measured: CUDA's allocator peak on GPUs, the process's peak
resident set (VmHWM, reset through /proc/self/clear_refs) on CPUs.

On CPUs the resident set only grows for memory that is new to the process: blocks that glibc recycles from
earlier frees are not counted, so in a long-running process the figure is a lower bound. It is exact when
freed blocks go back to the OS at once (`MALLOC_MMAP_THRESHOLD_=65536`, as benchmarks/sync.py sets).

See it work: tests/test_sync.py.
"""

from __future__ import annotations

import re

import torch


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"{field}:\s+(\d+)", f.read())
    except OSError:
        return None
    return int(match.group(1)) if match else None


class PeakMemory:
    """`with PeakMemory(device) as peak: ...` then `peak.extra_bytes` (None where it cannot be measured)."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.extra_bytes: int | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return self
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident set
            self._start = _status_kb("VmRSS")
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.extra_bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        elif self._start is not None:
            peak = _status_kb("VmHWM")
            self.extra_bytes = None if peak is None else max(peak - self._start, 0) * 1024
