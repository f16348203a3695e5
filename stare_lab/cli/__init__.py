"""Layer 7, the command line: `stare-lab` and its commands, each in one file (training, reading, claims, sweep).
May import every folder; nothing imports it.

A reader that goes before the output ends (`stare-lab table ... | head`, `sweep status ... | head -3`)
ends the command quietly, as it ends a Unix tool: no traceback, no "Exception ignored", nothing more
on stderr, exit status 141, the status a shell gives `yes | head` (128 + SIGPIPE). 141 rather than 0:
the command did not write all it had, and a script under `set -o pipefail` is told so, as it is of
`yes`. One mechanism for every command (cli/common.py, `output_guarded`): while a command runs, a
write or flush of stdout or stderr that meets EPIPE raises `ReaderGone`, wherever the command
printed from, and `main` returns 141. A `sweep run` whose reader goes ends so too, as a driver that
died: its local workers go on, and the next `sweep run` watches them.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

from stare_lab.cli.claims import cmd_claims
from stare_lab.cli.common import EXIT_READER_GONE, OneLineParser, ReaderGone, UserError, output_guarded, parse
from stare_lab.cli.reading import (
    READING_COMMANDS,
    _plot,
    _sweep_root,
    cmd_dashboard,
    cmd_plot,
    cmd_table,
    cmd_view,
    output_lines,
)
from stare_lab.cli.sweep import main as sweep_main
from stare_lab.cli.training import cmd_eval, cmd_train
from stare_lab.config.run_config import SWEEP_DIR, ConfigError
from stare_lab.core.utils import start_forked
from stare_lab.methods.outside import RuleImportError, reading
from stare_lab.plan.schema import SweepError

__all__ = ["EXIT_READER_GONE", "UserError", "main"]

HELP = """stare-lab: the command line (docs/design.md, "Command line").

    stare-lab demo
    stare-lab train [--import MODULE] method=stare seed=1 ...
    stare-lab sweep run sweeps/X.yaml [--import MODULE] [--launcher slurm] [--dry-run]
    stare-lab sweep status sweeps/X.yaml
    stare-lab eval runs/X/<run-id> [--n 32] [--import MODULE]
    stare-lab table sweeps/X.yaml [--format md|latex|csv] [--baseline full|none] [--seeds-needed [DELTA]]
    stare-lab claims sweeps/X.yaml [--format md|latex|csv] [--out DIR] [--alpha 0.05]
    stare-lab plot sweeps/X.yaml [--no-selection]
    stare-lab view runs/X/<run-id>|sweeps/X.yaml [--step N] [--out FILE]
    stare-lab dashboard sweeps/X.yaml [--offline] [--name NAME] [--out FILE]

User mistakes print one line on stderr and exit 2; no traceback. A reader that goes before the
output ends (`stare-lab table ... | head`) ends the command quietly, exit 141 as `yes | head`.
"""

# The commands by family (HELP is `--help`'s text): training and evaluation
# (cli/training.py); reading the records: table, plot, view, dashboard (cli/reading.py); sweeps
# (stare_lab.cli.sweep); `demo` runs them one after the other (here). What they share: the one-line
# refusal and argument parsing (cli/common.py).


def main(argv: list[str] | None = None) -> int:
    """The `stare-lab` console command: 0 done, 1 a run failed, 2 a user's mistake (one line), 130 Ctrl-C,
    141 the output's reader went before it ended (the module's docstring)."""
    try:
        with output_guarded():
            return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except ReaderGone:
        return EXIT_READER_GONE


def _dispatch(argv: list[str]) -> int:
    """The command `argv` names, run; its refusals in one line."""
    if not argv or argv[0] in ("-h", "--help"):
        print(HELP)
        return 0
    cmd, rest = argv[0], argv[1:]
    commands = {
        "train": cmd_train,
        "demo": cmd_demo,
        "sweep": sweep_main,
        "eval": cmd_eval,
        "table": cmd_table,
        "claims": cmd_claims,
        "plot": cmd_plot,
        "view": cmd_view,
        "dashboard": cmd_dashboard,
    }
    if cmd not in commands:
        return _fail(f"unknown command {cmd!r}; valid: {', '.join(commands)}")
    try:  # the reading commands work from the records: they import no rule kept outside the package
        with reading() if cmd in READING_COMMANDS else nullcontext():
            return commands[cmd](rest)
    except (UserError, ConfigError, SweepError, RuleImportError, FileNotFoundError) as e:
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except KeyboardInterrupt:
        print("stare-lab: interrupted", file=sys.stderr)
        return 130


def _fail(msg: str) -> int:
    print(f"stare-lab: error: {msg}", file=sys.stderr)
    return 2


def cmd_demo(argv: list[str]) -> int:
    """sweeps/demo.yaml on the built-in model with the local launcher, then the table and plots."""
    p = OneLineParser(prog="stare-lab demo")
    p.add_argument("--sweep", type=Path, default=SWEEP_DIR / "demo.yaml")
    p.add_argument("--out", type=Path, default=Path("analysis") / "demo", help="default: ./analysis/demo")
    a = parse(p, argv)
    rc = sweep_main(["run", str(a.sweep), "--retry-failed"])  # the demo is one button: a failed run is retried
    if rc == 130:  # Ctrl-C: the launcher has said what it stopped
        return rc
    if rc != 0:
        print("stare-lab demo: some runs did not finish; the table shows what exists", file=sys.stderr)
    # the token page (~3.5 s of CPU: every rule on every arm's kept batch, Chromium's screenshot) in a
    # forked process, on the other core while the table and figures are made
    page = start_forked(_demo_token_page, [(a.sweep, a.out)], 1)
    cmd_table([str(a.sweep), "--out", str(a.out)])
    print(f"\noutputs under {a.out}/:")
    print("\n".join(output_lines(sorted(a.out.glob("results.*")) + sorted(a.out.glob("passk_*.md")))))
    _plot(_sweep_root(a.sweep), a.out / "figures", "full")
    for line, to_stderr in page()[0]:
        print(line, file=sys.stderr if to_stderr else sys.stdout)
    return rc


def _demo_token_page(sweep: Path, out: Path) -> list[tuple[str, bool]]:
    """The demo's token page (every arm at the last kept step) and, where Chromium is installed, its
    screenshot: the lines to print, each with whether it goes to stderr."""
    from stare_lab.viewer.browser import chromium_path, screenshot  # deferred: the viewer's torch
    from stare_lab.viewer.page import ViewError, render_sweep
    from stare_lab.viewer.selection import one_thread

    try:
        with one_thread():  # beside the figures' processes: one core each
            page = render_sweep(sweep, out=out / "tokens.html")
    except ViewError as e:
        return [(f"stare-lab demo: no token page ({e})", True)]
    pages = [page] + ([screenshot(page, out / "tokens.png")] if chromium_path() is not None else [])
    return [(line, False) for line in output_lines(pages)]
