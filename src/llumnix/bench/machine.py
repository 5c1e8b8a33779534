"""Describe the machine a benchmark ran on, for its JSON record."""
from __future__ import annotations

import json
import os
import platform
import resource
from pathlib import Path
from typing import Any

RESULTS_DIR = "llumnix-results"
"""Where `llumnix bench`, `profile` and `simulate` write unless --out says otherwise: a
folder in the current working directory (ignored by git), so a run never rewrites the
repository's committed results; to update those, name their path with --out."""


def machine_info(with_torch: bool = True) -> dict[str, object]:
    """CPU, cores, Python, platform, load average; torch version and threads unless
    ``with_torch`` is False (the simulator never imports torch)."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, object] = {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "platform": platform.platform(), "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if not with_torch:
        return info
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; peak where unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def write_result(path: str | Path, record: dict[str, Any], *, quiet: bool = False) -> Path:
    """Write a benchmark's record as JSON (its folder made if missing); says where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    if not quiet:
        print(f"wrote {path}")
    return path
