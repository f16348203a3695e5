"""What every command shares: the one-line refusal and argument parsing that refuses in one line."""

from __future__ import annotations

import argparse

from stare_lab.core.utils import CommandLineError, OneLineParser

__all__ = ["OneLineParser", "UserError", "parse"]


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
