#!/usr/bin/env bash
# Run pytest once under each of ATen's CPU kernel sets (scalar, AVX2, AVX-512), as a CPU of each kind
# would: tests that compare floats across a split, a process count or a chunking must pass under all
# three. oneDNN and MKL are capped to match (stare_lab.core.utils.kernel_env). Only the sets the CPU has
# (stare_lab.core.utils.cpu_kernel_sets): torch runs AVX-512 kernels when asked and dies of SIGILL without them.
#   benchmarks/kernels_pytest.sh tests/training/test_distributed.py tests/signals/test_js_layout.py
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
grep -m1 "model name" /proc/cpuinfo
rc=0
sets=$($PY -c 'from stare_lab.core.utils import cpu_kernel_sets; print(*cpu_kernel_sets())')
for cap in default avx2 avx512; do
  case " $sets " in *" $cap "*) ;; *) echo "== $cap left out: not on this CPU (it has: $sets)"; continue ;; esac
  vars=$($PY -c "from stare_lab.core.utils import kernel_env; print(*(f'{k}={v}' for k, v in kernel_env('$cap').items()))")
  echo "== $vars ($(env $vars $PY -c 'import torch; print(torch.backends.cpu.get_cpu_capability())'))"
  env $vars $PY -m pytest -q -p no:cacheprovider -rfEs "$@" || rc=1
done
exit $rc
