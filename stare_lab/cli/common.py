"""What every command shares: the one-line refusal and argument parsing that refuses in one line."""

from __future__ import annotations

import argparse


class UserError(Exception):
    """A user's mistake: the command line prints its first line on stderr and exits 2 (no traceback)."""


def parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`p.parse_args(argv)`; bad arguments (after argparse's own usage lines) end as a UserError, so
    the command exits like every other refusal; `--help` exits 0 as argparse does."""
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise UserError(f"bad arguments for {p.prog}: {' '.join(argv)}") from None
