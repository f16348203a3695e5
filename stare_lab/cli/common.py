"""What every command shares: the one-line refusal, argument parsing that refuses in one line, and
output whose reader may go before it ends (`stare-lab table ... | head`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TextIO, cast

from stare_lab.core.utils import CommandLineError, OneLineParser

__all__ = ["EXIT_READER_GONE", "OneLineParser", "ReaderGone", "UserError", "output_guarded", "parse"]

# `yes | head` ends with this status in a shell: 128 + SIGPIPE's 13, the status of a process that signal ended
EXIT_READER_GONE = 141


class UserError(Exception):
    """A user's mistake: the command line prints its first line on stderr and exits 2 (no traceback)."""


def parse(p: OneLineParser, argv: list[str]) -> argparse.Namespace:
    """`p.parse_args(argv)`; bad arguments end as a UserError naming the command and argparse's reason
    (`stare-lab table: argument --format: invalid choice: ...`), without the usage block, so the command
    exits like every other refusal; `--help` exits 0 as argparse does."""
    try:
        return p.parse_args(argv)
    except CommandLineError as e:
        raise UserError(str(e)) from None


class ReaderGone(BaseException):
    """The reader of the command's stdout or stderr has gone. A BaseException, not an OSError as
    BrokenPipeError is: a command's own `except OSError` (the sweep driver's line for a disk that
    filled up) or `except Exception` must not take it for a failed write of records."""


class _Guarded:
    """sys.stdout or sys.stderr while a command runs: a write or flush that meets EPIPE ends the
    command (ReaderGone), wherever it printed from (argparse's help, rich's tables, the viewer's
    lines); everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _reader_gone(self._stream)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _reader_gone(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _reader_gone(stream: TextIO) -> NoReturn:
    """As a Unix tool ends on SIGPIPE, without Python's traceback or its "Exception ignored" at exit:
    the stream's descriptor now points at /dev/null, so what is still buffered (and the interpreter's
    last flush) goes nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stream without a descriptor (a test's capture): nothing to flush at exit
        pass
    raise ReaderGone


@contextmanager
def output_guarded() -> Iterator[None]:
    """A command's stdout and stderr through `_Guarded`; stdout's last lines flushed here, where EPIPE
    is still caught: a short output is otherwise written only by the interpreter's final flush, whose
    EPIPE prints "Exception ignored" and exits 120."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = cast(TextIO, _Guarded(streams[0])), cast(TextIO, _Guarded(streams[1]))
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
        finally:
            sys.stdout, sys.stderr = streams
