"""Busy machine, server speed by executor: Piper's server, voxserve (lanes, the default) and voxserve
--executor serial side by side, one long corpus text per request, interleaved rounds; with
"busy", two `while True: pass` processes beside them (docs/benchmarks.md, "A lean server").

    PYTHONPATH=src .venv/bin/python benchmarks/busy_executors.py busy 2
"""
import os, sys, time, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lean_server as L
arms = {'piper': None, 'lanes': '', 'serial': '--executor serial'}
srv = {}
port = 18870
for k, f in arms.items():
    srv[k] = L.Server('piper' if f is None else 'voxserve', port, f or ''); port += 1
for s in srv.values(): s.wait_ready()
long_ = L.texts('long')[:1]
for s in srv.values(): s.speak('Hello there, a warm up.')
res = {}
busy = sys.argv[1] == 'busy'
loops = L.busy_loops() if busy else []
try:
    for r in range(int(sys.argv[2])):
        for k, s in srv.items():
            t = time.perf_counter()
            for x in long_: s.speak(x)
            res.setdefault(k, []).append(time.perf_counter() - t)
        print(r, {k: round(v[-1], 2) for k, v in res.items()}, os.getloadavg()[0], flush=True)
finally:
    L.stop_all(loops)
    for s in srv.values(): s.stop()
p = statistics.median(res['piper'])
for k, v in res.items(): print(k, round(statistics.median(v), 2), 'speed vs piper', round(p / statistics.median(v), 2))
