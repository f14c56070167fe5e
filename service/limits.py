"""The process's open-file limit: raised to its hard limit at start, so connections are refused by our
caps (service/ports.py) before the process runs out of descriptors (accept failing with EMFILE).

Every process that listens raises its own: the server's (service/server.py) and each frontend's.
"""

from __future__ import annotations

import resource

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
