"""What the host allows the process. Its open-file limit: raised to its hard limit at start, so
connections are refused by our caps (service/ports.py) before the process runs out of descriptors
(accept failing with EMFILE). The memory it may still take (`host_memory_free_bytes`), which sizes
the parked-session budget (service/loading.py).

Every process that listens raises its own: the server's (service/server.py) and each frontend's.
"""

from __future__ import annotations

import resource
from pathlib import Path

import structlog

log = structlog.get_logger("ladder.limits")
UNLIMITED = 1 << 20  # what an unlimited limit counts as (Linux's default fs.nr_open)


def raise_file_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one (logged); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED if hard == resource.RLIM_INFINITY else hard  # the kernel refuses "infinite" here
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            log.warning("file_limit_unchanged", soft=soft, hard=hard)
    soft = file_limit()
    log.info("file_limit", soft=soft, hard=hard)
    return soft


def file_limit() -> int:
    """The open-file soft limit in force now (RLIM_INFINITY as a large number)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return UNLIMITED if soft == resource.RLIM_INFINITY else soft


def host_memory_free_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int:
    """Memory this process may still take: the host's MemAvailable, or less where a cgroup (v2, else
    v1) limit leaves less (a Kubernetes pod's memory limit). 0 when none of them can be read."""
    free: list[int] = []
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    root = Path(cgroup)
    for limit, used in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            cap = (root / limit).read_text().strip()
            if cap != "max" and int(cap) < 1 << 60:  # v1 writes "no limit" as a huge number
                free.append(max(0, int(cap) - int((root / used).read_text())))
                break
        except (OSError, ValueError):
            continue
    return min(free, default=0)
