"""What a waiting test prints when it times out: every process it waits on, their states, their Python
stacks, and who still holds the pipe it reads.

A wait that ends only inside the whole suite (a loaded CI machine, a process left by an earlier test)
can not be rerun at will: the CI log must say where each process was. `install()` (called by
tests/conftest.py) wraps `subprocess.Popen.communicate` and `.wait`: when one of them times out after
`REPORT_AFTER_S` or more, the report of that process's tree is written to stderr (pytest shows it
under the failing test) before the timeout propagates, while the processes are still alive
(`subprocess.run` kills its child only after). `sweep_fixtures.wait_until` prints the report of
every descendant of the test process when its predicate times out.

Per process: pid, parent, state (psutil), whether it ignores SIGINT or SIGTERM (/proc/PID/status),
the kernel function it sleeps in (/proc/PID/wchan), its command line, and its Python stacks by
`py-spy dump` (any Python process, without its cooperation; root or ptrace rights needed, both there
in CI). For a Popen read through a pipe, every process that still holds the pipe's write end is listed,
the tree's or not: a grandchild that outlived its parent keeps `communicate()` waiting after the child
itself has ended.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

REPORT_AFTER_S = 10.0  # shorter timeouts are tests asking "is it still running?", not waits that hung
_PY_SPY_S = 20.0


def _wchan(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    return "?"


def _ignored(pid: int) -> str:
    """The signals a process ignores among SIGINT and SIGTERM ('ignores SIGINT'): a process started with
    SIGINT ignored (the background job of a non-interactive shell) never sees a Ctrl-C."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        mask = int(next(ln for ln in lines if ln.startswith("SigIgn:")).split()[1], 16)
        names = [name for name, num in (("SIGINT", 2), ("SIGTERM", 15)) if mask >> (num - 1) & 1]
        return f" ignores {'+'.join(names)}" if names else ""
    return ""


def _pipe_inodes(pid: int) -> set[str]:
    """The pipes (as 'pipe:[inode]') among a process's open files."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("pipe:"):
                    found.add(link)
    return found


def pipe_holders(stream) -> list[int]:
    """Pids of the processes (other than this one) holding the other end of the pipe `stream` reads."""
    try:
        inode = f"pipe:[{os.fstat(stream.fileno()).st_ino}]"
    except (OSError, ValueError, AttributeError):
        return []
    return sorted(p for p in psutil.pids() if p != os.getpid() and inode in _pipe_inodes(p))


def _stack(pid: int) -> str:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return "    (no py-spy: its stack can not be read)"
    try:
        out = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=_PY_SPY_S)
    except subprocess.TimeoutExpired:
        return f"    (py-spy dump did not answer in {_PY_SPY_S:g} s)"
    text = (out.stdout or out.stderr).strip()
    return "\n".join("    " + line for line in text.splitlines()) or "    (py-spy printed nothing)"


def describe(pid: int) -> str:
    """One process: pid, ppid, state, wchan, command line, then its Python stacks where it runs Python."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            state = f"{p.status()}{_ignored(pid)} wchan={_wchan(pid)}"
            head = f"pid {pid} ppid {p.ppid()} {state}: {' '.join(p.cmdline())[:300]}"
            python = "python" in p.name().lower() or "python" in " ".join(p.cmdline()[:1]).lower()
    except psutil.Error as e:
        return f"pid {pid}: gone ({type(e).__name__})"
    return head + ("\n" + _stack(pid) if python and p.status() != psutil.STATUS_ZOMBIE else "")


def report(pids: list[int], title: str, readers: list[int] | None = None) -> str:
    """The report of `pids` and their descendants; `readers`: holders of a pipe being read, listed apart."""
    tree: list[int] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            tree += [pid] + [c.pid for c in root.children(recursive=True)]
    tree = list(dict.fromkeys(tree))
    lines = [f"==== {title}: {len(tree)} process(es) ===="]
    lines += [describe(pid) for pid in tree]
    others = [p for p in readers or [] if p not in tree]
    if readers is not None:
        lines.append(f"---- holding the pipe read: {readers or 'nobody'}")
        lines += [describe(pid) for pid in others]
    lines.append("==== end of report ====")
    return "\n".join(lines)


def report_children(title: str) -> str:
    """The report of every descendant of this process (a test's children, their children)."""
    return report([c.pid for c in psutil.Process().children()], title)


def _popen_report(popen: subprocess.Popen, timeout: float | None, what: str) -> None:
    if timeout is None or timeout < REPORT_AFTER_S:
        return
    readers = sorted({*pipe_holders(popen.stdout), *pipe_holders(popen.stderr)})
    pids = [popen.pid] if popen.poll() is None else []
    text = report(pids, f"{what}(timeout={timeout:g}) timed out on {popen.args!r:.200}", readers)
    print(text, file=sys.stderr, flush=True)


def install() -> None:
    """Wrap Popen.communicate and Popen.wait so that a long timeout reports before it propagates."""
    if getattr(subprocess.Popen, "_hang_report", False):
        return
    communicate, wait = subprocess.Popen.communicate, subprocess.Popen.wait

    def reported_communicate(self, input=None, timeout=None):  # noqa: A002 - Popen's own name
        self._in_communicate = True  # its own inner wait() does not report a second time
        try:
            return communicate(self, input, timeout)
        except subprocess.TimeoutExpired:
            _popen_report(self, timeout, "communicate")
            raise
        finally:
            self._in_communicate = False

    def reported_wait(self, timeout=None):
        try:
            return wait(self, timeout)
        except subprocess.TimeoutExpired:
            if not getattr(self, "_in_communicate", False):
                _popen_report(self, timeout, "wait")
            raise

    subprocess.Popen.communicate = reported_communicate  # type: ignore[method-assign]
    subprocess.Popen.wait = reported_wait  # type: ignore[method-assign]
    subprocess.Popen._hang_report = True  # type: ignore[attr-defined]
