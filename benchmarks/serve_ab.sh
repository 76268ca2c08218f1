#!/usr/bin/env bash
# Two checkouts of voxserve side by side under the same load (8 clients, short and medium texts),
# with the second also under `--executor serial`: rounds interleaved in a rotating order, round 1 a warm-up. Loopback
# only. Usage: [PORT=18901] [REST_S=70] bash benchmarks/serve_ab.sh BEFORE_SRC AFTER_SRC [OUTDIR] [ROUNDS]
# (BEFORE_SRC/AFTER_SRC: the `src` folders of two worktrees, e.g. made with `git worktree add`).
set -u
BEFORE=$1; AFTER=$2; OUT=${3:-bench-out/serve_ab}; ROUNDS=${4:-4}; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}; P0=${PORT:-18901}  # the three servers listen on P0, P0+1, P0+2
ARMS=(before after serial); SRCS=("$BEFORE" "$AFTER" "$AFTER"); FLAGS=("" "" "--executor serial")
PIDS=()
for k in 0 1 2; do
  # shellcheck disable=SC2086  # flags are words
  PYTHONPATH=${SRCS[$k]} $PY -m voxserve serve --port $((P0 + k)) --device cpu ${FLAGS[$k]} > "$OUT/${ARMS[$k]}.log" 2>&1 &
  PIDS+=($!)
done
trap 'kill "${PIDS[@]}" 2>/dev/null' EXIT
up() { $PY -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null; }
for _ in $(seq 1 240); do ok=1; for k in 0 1 2; do up "http://127.0.0.1:$((P0 + k))/ready" || ok=0; done; [ $ok = 1 ] && break; sleep 1; done
for r in $(seq 1 "$ROUNDS"); do
  # the order rotates every round: with BEFORE always first, the arms' p95 differed by order
  # alone by up to ~40% (docs/benchmarks.md, "The short-request p95 at 8 clients")
  for j in 0 1 2; do k=$(( (j + r) % 3 ))
    PYTHONPATH=$AFTER timeout 600 $PY -m voxserve loadtest --url "http://127.0.0.1:$((P0 + k))" -c 8 -n 80 \
      --categories short,medium --warmup 4 --json "$OUT/r${r}_${ARMS[$k]}.json" > /dev/null 2>&1 || echo "FAILED r$r ${ARMS[$k]}"
  done
done
# RSS right after the rounds is no comparison of the arms: each server gives its allocator's free
# pages back once a minute while serving (voxserve.engine.RELEASE_PERIOD_S), and the arms run one
# after another, so at the end one has just released and another not (docs/benchmarks.md, issue
# 44's section). Compared: the peak (VmHWM), and the RSS once every server has released.
mb() { awk -v k="$2:" '$1 == k {print int($2/1024)}' "/proc/$1/status"; }
for k in 0 1 2; do echo "${ARMS[$k]} RSS at the end: $(mb "${PIDS[$k]}" VmRSS) MB, peak $(mb "${PIDS[$k]}" VmHWM) MB"; done
sleep "${REST_S:-70}"
for k in 0 1 2; do echo "${ARMS[$k]} RSS ${REST_S:-70} s later (released): $(mb "${PIDS[$k]}" VmRSS) MB"; done
$PY - "$OUT" <<'PY'
import glob, json, statistics as st, sys
rows = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/r*_*.json")):
    name = f.rsplit("/", 1)[1][:-5]
    r, arm = name.split("_", 1)
    d = json.load(open(f))
    a, s = d["all"], d["by_category"]["short"]
    print(f"{name:16} ok {a['ok']:2} audio s/s {a['audio_s_per_s']:6.2f}  short p95 {s['latency_p95_s']:5.2f} s")
    if r != "r1":  # round 1 warms the servers' admission estimates up
        rows.setdefault(arm, []).append((a["audio_s_per_s"], s["latency_p95_s"]))
for arm, v in rows.items():
    print(f"{arm:8} median of rounds 2-: audio s/s {st.median(x[0] for x in v):.2f}, short p95 {st.median(x[1] for x in v):.2f} s")
PY
