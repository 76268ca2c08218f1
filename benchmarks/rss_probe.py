"""`voxserve serve` with a memory probe: on SIGUSR1 the server writes what holds its memory to
$PROBE_OUT/$PROBE_TAG-<n>.json (VmRSS/VmHWM/Threads, smaps_rollup, jemalloc's stats and each
arena's dirty pages where jemalloc is loaded, the live threads' names, and a walk of every object
reachable from the Engine: counts of voxserve's types, arrays and tensors). Used to trace the
8-client RSS difference of issue 44 (docs/benchmarks.md); the walk allocates, so a sample is taken
before it and later samples see its garbage (the same in every server probed).

    PROBE_OUT=/tmp/probe PROBE_TAG=after PYTHONPATH=src python benchmarks/rss_probe.py serve --port 18911 --device cpu &
    kill -USR1 $!   # after each round of load
"""
import ctypes, gc, json, os, signal, sys, threading, time, collections

OUT = os.environ.get("PROBE_OUT", "bench-out/rss_probe")
os.makedirs(OUT, exist_ok=True)
_n = [0]

def _je():
    try:
        lib = ctypes.CDLL("libjemalloc.so.2")
    except OSError:
        return None
    def get(name, ctype=ctypes.c_size_t):
        v = ctype(0); sz = ctypes.c_size_t(ctypes.sizeof(v))
        rc = lib.mallctl(name.encode(), ctypes.byref(v), ctypes.byref(sz), None, ctypes.c_size_t(0))
        return v.value if rc == 0 else None
    e = ctypes.c_uint64(1); sz = ctypes.c_size_t(8)
    lib.mallctl(b"epoch", ctypes.byref(e), ctypes.byref(sz), ctypes.byref(e), ctypes.c_size_t(8))
    d = {k: get("stats." + k) for k in ("allocated", "active", "resident", "mapped", "retained", "metadata")}
    n = get("arenas.narenas", ctypes.c_uint)
    ar = []
    for i in range(n or 0):
        ar.append(dict(nthreads=get(f"stats.arenas.{i}.nthreads", ctypes.c_uint),
                       pactive=get(f"stats.arenas.{i}.pactive"), pdirty=get(f"stats.arenas.{i}.pdirty"),
                       small=get(f"stats.arenas.{i}.small.allocated"), large=get(f"stats.arenas.{i}.large.allocated")))
    d["arenas"] = ar
    return {k: (v // 2**20 if isinstance(v, int) and k != "arenas" else v) for k, v in d.items()}

def _walk(root):
    import numpy as np
    try:
        import torch
    except ImportError:
        torch = None
    seen, stack = set(), [root]
    counts = collections.Counter(); nbytes = collections.Counter()
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, type(sys))):
            continue
        seen.add(id(o))
        t = type(o)
        if str(getattr(t, "__module__", "")).startswith("voxserve"):
            counts[t.__name__] += 1
        if isinstance(o, np.ndarray):
            counts["ndarray"] += 1; nbytes["ndarray"] += o.nbytes
        elif torch is not None and isinstance(o, torch.Tensor):
            counts["tensor"] += 1; nbytes["tensor"] += o.numel() * o.element_size()
        if isinstance(o, threading.Thread):
            continue
        stack.extend(gc.get_referents(o))
    return dict(counts=dict(counts.most_common(40)), mb={k: v / 2**20 for k, v in nbytes.items()}, objects=len(seen))

def dump(*_):
    try:
        _dump()
    except BaseException as e:
        import traceback; traceback.print_exc()

def _dump():
    _n[0] += 1
    d = {"t": time.time()}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM", "Threads")):
            k, v = line.split(":", 1); d[k] = v.strip()
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith(("Rss", "Anonymous", "Private_Dirty")):
            k, v = line.split(":", 1); d["rollup_" + k] = v.strip()
    d["jemalloc"] = _je()
    d["threads"] = sorted(t.name for t in threading.enumerate())
    engines = [o for o in gc.get_objects() if type(o).__name__ == "Engine" and str(getattr(type(o), "__module__", "")).startswith("voxserve.engine")]
    d["engines"] = len(engines)
    if engines:
        d["reach"] = _walk(engines[0])
    d["gc_types"] = dict(collections.Counter(type(o).__name__ for o in gc.get_objects()
                                              if str(getattr(type(o), "__module__", "")).startswith("voxserve")).most_common(30))
    try:
        import torch
        d["tensors_gc"] = sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
    except Exception:
        pass
    with open(f"{OUT}/{os.environ.get('PROBE_TAG', os.getpid())}-{_n[0]}.json", "w") as f:
        json.dump(d, f, indent=1)

signal.signal(signal.SIGUSR1, dump)
sys.argv = ["voxserve", *sys.argv[1:]]
from voxserve.cli import main
sys.exit(main())
