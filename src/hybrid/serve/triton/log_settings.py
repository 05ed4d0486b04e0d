"""Triton's logging extension: the server's log settings, read and changed by a client.

The routes are ``GET`` / ``POST /v2/logging`` and gRPC ``LogSettings`` (tritonclient's ``get_log_settings`` /
``update_log_settings``). The settings are Triton's six, mapped onto the ``hybrid`` logger, which every pyasc
module logs under:

=====================  ==============================================================================
``log_info``           INFO records are written
``log_warning``        WARNING records are written
``log_error``          ERROR records are written
``log_verbose_level``  > 0: DEBUG records are written too
``log_format``         ``default`` (pyasc's lines) or ``ISO8601`` (each line starts with its UTC time)
``log_file``           always ``""`` (the process's standard error); not settable over the network
=====================  ==============================================================================

Python's logging writes records by severity threshold, so the switches must describe one: a severity on means
every higher one is on (warnings cannot be off while info is on). An update that breaks this, an unknown
key, a value of the wrong type or a new ``log_file`` is HYB-702 (Triton 2.51 ignores unknown keys and answers
500 or 501 to the rest). An update changes the whole process's ``hybrid`` logger, as Triton's changes its
process: serve with ``--auth-token`` where others can reach the port.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any

from hybrid.errors import ServingError

__all__ = ["FORMATS", "LogSettings"]

FORMATS = ("default", "ISO8601")

_SWITCHES = (("log_error", logging.ERROR), ("log_warning", logging.WARNING), ("log_info", logging.INFO))
_KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
_HINT = "e.g. {'log_info': false} or {'log_verbose_level': 1}; tritonclient: update_log_settings"


def _bad(message: str) -> ServingError:
    return ServingError("HYB-702", message, _HINT)


class _Iso8601(logging.Formatter):
    """A formatter that puts the record's UTC time, ISO 8601 to the microsecond, before another's line."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs * 1000):06d}Z {self.inner.format(record)}"


class LogSettings:
    """The log settings of a server over one logger (``hybrid``); thread-safe.

    Args:
        logger: The logger the settings govern.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger or logging.getLogger("hybrid")
        self._lock = threading.Lock()
        self._format = "default"
        self._verbose = 1  # the verbose level last asked for, reported while DEBUG records are written

    def current(self) -> dict[str, Any]:
        """The six settings as Triton reports them, read from the logger's level."""
        level = self._logger.getEffectiveLevel()
        doc: dict[str, Any] = {"log_file": ""}
        doc.update({key: level <= threshold for key, threshold in reversed(_SWITCHES)})
        doc["log_verbose_level"] = self._verbose if level <= logging.DEBUG else 0
        doc["log_format"] = self._format
        return {key: doc[key] for key in _KEYS}

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (any of the six keys) and return the settings now.

        Raises:
            ServingError: HYB-702 for an unknown key, a value of the wrong type, a new ``log_file``, or
                switches that are not one severity threshold; nothing is changed then.
        """
        unknown = sorted(set(changes) - set(_KEYS))
        if unknown:
            raise _bad(f"unknown log setting(s) {', '.join(map(repr, unknown))}; the settings are {', '.join(_KEYS)}")
        with self._lock:
            wanted = {**self.current(), **changes}
            for key, _ in _SWITCHES:
                if not isinstance(wanted[key], bool):
                    raise _bad(f"log setting {key!r} must be true or false, got {wanted[key]!r}")
            verbose = wanted["log_verbose_level"]
            if isinstance(verbose, bool) or not isinstance(verbose, int) or not 0 <= verbose < 1 << 32:
                raise _bad(f"log setting 'log_verbose_level' must be an integer in 0..{(1 << 32) - 1} (gRPC's "
                           f"uint32), got {verbose!r}")
            if wanted["log_format"] not in FORMATS:
                raise _bad(f"log setting 'log_format' must be one of {', '.join(FORMATS)}, got "
                           f"{wanted['log_format']!r}")
            if wanted["log_file"] != "":
                raise _bad("the log file cannot be changed over the network; the server logs to its standard "
                           "error (redirect it where it is started)")
            level = self._level(wanted)
            self._logger.setLevel(level)
            self._verbose = verbose or self._verbose
            self._set_format(wanted["log_format"])
            return self.current()

    @staticmethod
    def _level(wanted: dict[str, Any]) -> int:
        """The one threshold the switches describe.

        Raises:
            ServingError: HYB-702 for switches no threshold describes (a severity off below one that is on).
        """
        on = [wanted[key] for key, _ in _SWITCHES] + [wanted["log_verbose_level"] > 0]  # error ... verbose
        if any(lower and not higher for higher, lower in itertools.pairwise(on)):
            names = [key for key, _ in _SWITCHES] + ["log_verbose_level"]
            state = ", ".join(f"{n}={'on' if v else 'off'}" for n, v in zip(names, on, strict=True))
            raise _bad(f"pyasc writes log records by severity: a severity on needs every higher one on ({state})")
        if on[3]:
            return logging.DEBUG
        for (_, threshold), enabled in zip(reversed(_SWITCHES), reversed(on[:3]), strict=True):
            if enabled:
                return threshold
        return logging.CRITICAL + 10  # nothing is written

    def _set_format(self, name: str) -> None:
        if name == self._format:
            return
        for handler in self._logger.handlers:
            if name == "ISO8601":
                handler.setFormatter(_Iso8601(handler.formatter))
            elif isinstance(handler.formatter, _Iso8601):
                handler.setFormatter(handler.formatter.inner)
        self._format = name
