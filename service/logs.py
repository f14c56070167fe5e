"""The server's logs: JSON lines on stderr through structlog, configured once per process."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str) -> None:
    """JSON lines on stderr at `level` and above, with the request id of the call that logs them."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
