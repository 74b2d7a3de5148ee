"""structlog set-up: key-value lines for terminals, JSON lines with --log-json; always stderr.

stdout belongs to the program's output (generated text, stdio events), never to logs.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", json: bool = False) -> None:
    """Route every structlog logger to stderr at `level`; call once at start-up."""
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=lambda *args: structlog.PrintLogger(sys.stderr),  # the stderr of the moment (tests swap it)
        cache_logger_on_first_use=False,
    )
