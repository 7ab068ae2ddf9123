"""Logging for the daemons: the usual text lines, or one JSON object a line
(`--log-format json`) for log collectors (Loki, Elasticsearch, journald's JSON export)."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
from collections.abc import Sequence

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else was passed with `extra=` and is kept.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, process,
    thread, the exception's traceback where there is one, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out:
                out[key] = value if isinstance(value, (str, int, float, bool)) or \
                    value is None else repr(value)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Set up the root logger once, for a daemon's main(). `level` and `fmt` default to
    HYPERSACK_LOG_LEVEL and HYPERSACK_LOG_FORMAT, then INFO and text."""
    level = (level or os.environ.get("HYPERSACK_LOG_LEVEL") or "INFO").upper()
    fmt = (fmt or os.environ.get("HYPERSACK_LOG_FORMAT") or "text").lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """A daemon's --log-level and --log-format."""
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO, or "
                   "HYPERSACK_LOG_LEVEL)")
    p.add_argument("--log-format", choices=LOG_FORMATS, help="text lines, or one JSON "
                   "object a line (default text, or HYPERSACK_LOG_FORMAT)")


def parse_daemon_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                      ) -> argparse.Namespace:
    """A daemon's flags, its logging configured from them (a bad level: usage error)."""
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level, args.log_format)
    except ValueError as exc:
        parser.error(str(exc))
    return args
