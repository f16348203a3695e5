"""Which demo numbers move with the CPU's vector width: the same sweep under two kernel sets, run by run.

Two CPU types give the same commit different last bits: torch's CPU kernels (ATen) and oneDNN's
matrix products are vectorised for the widest instruction set the CPU has (AVX-512 on an Intel Xeon,
AVX2 on older or smaller AMD EPYC VMs), and a wider vector sums in another order. On one machine
with AVX-512 both can be run: `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` makes torch use
the kernels it uses on an AVX2-only CPU. This script runs a sweep (default: the demo) once with the
machine's own kernels and once with AVX2's, each into a folder of its own, and prints every run's
evaluation side by side: the numbers that differ are the ones that move with the CPU type.

    python benchmarks/isa_reproducibility.py [--sweep stare_lab/sweeps/demo.yaml] [--dir /tmp/stare_isa]
                                             [--method ict --method full ...] [--seeds 0]

Training metrics differ in their last bits under the two kernel sets for every rule (grad norm,
entropy: ~1e-7 relative); the question is which evaluations a discrete choice (a selection, a
sampled token) turns that into.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import yaml

from stare_lab.core.utils import cpu_kernel_sets, kernel_env

# this CPU's own kernels, and AVX2's where the CPU has them (never a set it lacks: SIGILL)
KERNELS = {"native": {}, **({"avx2": kernel_env("avx2")} if "avx2" in cpu_kernel_sets() else {})}


def _cpu() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    return f"{model}, {'AVX-512' if 'avx512f' in info else 'no AVX-512'}, {os.cpu_count()} cores"


def _results(root: Path) -> dict[tuple[str, int], dict[str, float]]:
    """{(rule, seed): final evaluation metrics} of every finished run under a sweep's output folder."""
    out = {}
    for cfg_path in root.rglob("config.yaml"):
        run = cfg_path.parent
        finals = [p for p in run.glob("eval/*/*.json") if json.loads(p.read_text()).get("final")]
        if not finals:
            continue
        cfg = yaml.safe_load(cfg_path.read_text())
        out[(cfg["method"]["name"], int(cfg["seed"]))] = json.loads(finals[0].read_text())["metrics"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", type=Path, default=Path(__file__).parents[1] / "stare_lab" / "sweeps" / "demo.yaml")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/stare_isa"))
    ap.add_argument("--method", action="append", help="only these rules (repeatable); default: the sweep's grid")
    ap.add_argument("--seeds", type=int, nargs="+", help="only these seeds; default: the sweep's")
    ap.add_argument("--metric", default="avg@32")
    a = ap.parse_args()
    spec = yaml.safe_load(a.sweep.read_text())
    if a.method:
        spec["grid"]["method"] = a.method
    if a.seeds:
        spec["seeds"] = a.seeds
    stare_lab = Path(sys.executable).with_name("stare-lab")
    results = {}
    for name, env in KERNELS.items():
        folder = a.dir / name
        folder.mkdir(parents=True, exist_ok=True)
        sweep = dict(spec, name=f"{spec['name']}_{name}", output=str(folder / "runs"))
        path = folder / "sweep.yaml"
        path.write_text(yaml.safe_dump(sweep, sort_keys=False))
        print(f"== {name} kernels {env or '(this CPU)'}: {path}", flush=True)
        subprocess.run([str(stare_lab), "sweep", "run", str(path)], env={**os.environ, **env}, check=False)
        results[name] = _results(folder / "runs")
    print(f"\nmachine: {_cpu()}; torch kernels: this CPU's vs AVX2's; metric: {a.metric}")
    print(f"| rule | seed | {' | '.join(KERNELS)} | same |")
    print("|:--|--:|" + "--:|" * len(KERNELS) + ":-:|")
    moved = 0
    for key in sorted(set().union(*(r.keys() for r in results.values()))):
        vals = [results[k].get(key, {}).get(a.metric) for k in KERNELS]
        same = len(set(vals)) == 1 and None not in vals
        moved += not same
        cells = " | ".join("—" if v is None else f"{100 * v:.2f}" for v in vals)
        print(f"| {key[0]} | {key[1]} | {cells} | {'yes' if same else '**no**'} |")
    print(f"\n{moved} of {len(set().union(*(r.keys() for r in results.values())))} runs differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
