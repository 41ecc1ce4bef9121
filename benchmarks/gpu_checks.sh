#!/usr/bin/env bash
# Every GPU check except the long benchmark suite, in one go (for a lent GPU machine with little
# time). Usage, from the project root: bash benchmarks/gpu_checks.sh OUT_DIR
# Writes OUT_DIR/checks.log (all output), OUT_DIR/report.png and OUT_DIR/demo.txt.
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR}
mkdir -p "$out"
log=$out/checks.log
step() { echo; echo "=== $* ==="; }
{
  step "device"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  # Once per recorder core: the C one (where built) and the pure-Python reference (the core is
  # chosen at import, by CUDATIMER_PURE_PYTHON).
  step "pytest gpu (core: C where built)"
  python3 -c "import cudatimer; print('compiled', cudatimer.compiled())"
  python3 -m pytest -q -p no:cacheprovider -rs -m "gpu and not multigpu" tests 2>&1 | tail -60
  step "pytest gpu (core: pure Python)"
  CUDATIMER_PURE_PYTHON=1 python3 -m pytest -q -p no:cacheprovider -rs -m "gpu and not multigpu" tests 2>&1 | tail -60
  step "hot path"
  python3 benchmarks/hotpath.py --rounds 21 --iters 20
  step "quickstart"
  python3 examples/quickstart.py
  step "report demo"
  python3 examples/report_demo.py --out /tmp/demo --png "$out/report.png" > "$out/demo.txt" 2>&1 && \
    python3 -m cudatimer compare /tmp/demo/run.json /tmp/demo/run_small.json >> "$out/demo.txt" 2>&1
  tail -5 "$out/demo.txt"
  step "nsys"
  nsys profile -t cuda,nvtx -s none --cpuctxsw=none -o /tmp/r -f true \
    python3 benchmarks/nsys_check.py --workload --summary /tmp/ct.json > /tmp/nsys.log 2>&1
  tail -3 /tmp/nsys.log
  python3 benchmarks/nsys_check.py --check /tmp/r.nsys-rep --summary /tmp/ct.json
  step "sync overhead"
  python3 benchmarks/sync_overhead.py
} > "$log" 2>&1
tail -c 11000 "$log"
