#!/usr/bin/env bash
# Run pytest once under each of ATen's CPU kernel sets (scalar, AVX2, AVX-512), as a CPU of each kind
# would: tests that compare floats across a split, a process count or a chunking must pass under all
# three. oneDNN is capped to match (as benchmarks/isa_reproducibility.py does). On a CPU without
# AVX-512, torch falls back to its best kernels for "avx512" and says so in the header line.
#   benchmarks/kernels_pytest.sh tests/training/test_distributed.py tests/signals/test_js_layout.py
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
grep -m1 "model name" /proc/cpuinfo
rc=0
for cap in default avx2 avx512; do
  isa=$([ "$cap" = avx2 ] && echo AVX2 || echo ALL)  # the default kernels leave oneDNN's ISA alone
  echo "== ATEN_CPU_CAPABILITY=$cap ($(ATEN_CPU_CAPABILITY=$cap $PY -c 'import torch; print(torch.backends.cpu.get_cpu_capability())'))"
  ATEN_CPU_CAPABILITY=$cap ONEDNN_MAX_CPU_ISA=$isa $PY -m pytest -q -p no:cacheprovider -rfEs "$@" || rc=1
done
exit $rc
