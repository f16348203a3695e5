"""How long `stare-lab view` takes on a 64-rollout × 1k-token batch with every rule, and how long the
page takes to open in headless Chromium (targets: ≤ 5 s and ≤ 2 s, issue 13). Prints the numbers.

    .venv/bin/python benchmarks/viewer_speed.py [--rollouts 64] [--tokens 1024]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the random batch is a test fixture

from synthetic_batch import write_random_batch  # noqa: E402

from stare_lab.viewer.browser import chromium_path, dump_dom  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        path = write_random_batch(run, 100, B=args.rollouts, T=args.tokens, G=8, seed=0)
        print(f"batch: {args.rollouts} rollouts × {args.tokens} tokens, file {path.stat().st_size / 1e6:.2f} MB")
        # the command as a user runs it: a fresh interpreter, imports included
        t0 = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from stare_lab.viewer import main_view; sys.exit(main_view(sys.argv[1:]))",
                str(run),
            ],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            print(done.stderr)
            return 1
        page = Path(done.stdout.strip())
        t0 = time.perf_counter()
        from stare_lab.viewer import render_run

        imports = time.perf_counter() - t0
        t0 = time.perf_counter()
        render_run(run)
        inproc = time.perf_counter() - t0
        print(f"stare-lab view (fresh process): {wall:.2f} s   [target ≤ 5 s]")
        print(
            f"  of which render_run in process: {inproc:.2f} s (imports {imports:.2f} s); "
            f"page {page.stat().st_size / 1e6:.2f} MB"
        )
        if chromium_path() is None:
            print("page load: skipped (no chromium; apt-get install -y chromium)")
            return 0
        t0 = time.perf_counter()
        dom = dump_dom(page, budget_ms=0)  # real time: performance.now() is wall time
        browser_wall = time.perf_counter() - t0
        ok = 'data-ok="1"' in dom
        ms = re.search(r'data-render-ms="(\d+)"', dom)
        spans = dom.count('<span class="tok')
        print(
            f"page load in Chromium: script done at {int(ms.group(1)) / 1000 if ms else float('nan'):.2f} s after "
            f"navigation start   [target ≤ 2 s]; ok={ok}, {spans} token spans"
        )
        print(f"  chromium --dump-dom wall time incl. browser start and serialising the DOM: {browser_wall:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
