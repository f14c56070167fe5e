"""The harness (tests/support) is loaded here for every test; logging goes where pytest shows it."""

from __future__ import annotations

import sys

import structlog

pytest_plugins = ["tests.support.fixtures"]

# In-process servers log every call (access lines; forwards at debug level). Their lines go to the
# process's own stderr, which pytest reports with a failing test, never into what capsys reads.
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.__stderr__))
