"""The rehearsal's import rule (`scripts/gpu-check --rehearse` puts this folder on PYTHONPATH, so
every Python it starts, pytest and the benchmarks included, reads it first): a module that an
installed distribution provides is importable only if the GPU machine has that distribution
(machine.py, with what those require as installed here) or it is found on PYTHONPATH before this
Python's site-packages (this tree, what the pack carries). For any other, the finders of the
site-packages folders are made blind to it: `import` raises ModuleNotFoundError and
importlib.util.find_spec answers None, as on a machine without it, so optional imports and
transformers' availability checks behave the same."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import site
import sys


def _with_requirements(names: set[str]) -> set[str]:
    """The machine's distributions and what they require as installed here (where this Python
    has another version of one, e.g. huggingface-hub 2.x needing httpx2, its requirements
    stand in for the machine's version's)."""
    import machine
    import re

    out, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.add(n)
        try:
            reqs = importlib.metadata.requires(n) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [machine.norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in reqs if "extra ==" not in r]
    return out


class _Without:
    """This Python's finder of a site-packages folder, blind to the blocked top-level names."""

    def __init__(self, inner, blocked: set[str]):
        self.inner, self.blocked = inner, blocked

    def find_spec(self, fullname, target=None):
        if fullname.partition(".")[0] in self.blocked:
            return None
        return self.inner.find_spec(fullname, target)

    def invalidate_caches(self):
        self.inner.invalidate_caches()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _install() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    try:
        import machine  # scripts/gpu_check/machine.py
    finally:
        sys.path.pop(0)
    allowed = _with_requirements(machine.packages())
    blocked = {name for name, dists in importlib.metadata.packages_distributions().items()
               if name not in sys.stdlib_module_names and not any(machine.norm(d) in allowed for d in dists)}
    installed = {os.path.realpath(p) for p in (*site.getsitepackages(), site.getusersitepackages())}
    for entry in sys.path:
        if os.path.realpath(entry) in installed:
            inner = importlib.machinery.PathFinder._path_importer_cache(entry)
            if inner is not None:
                sys.path_importer_cache[entry] = _Without(inner, blocked)

    class PathFinder(importlib.machinery.PathFinder):
        """...and importlib.metadata blind to those distributions (pytest loads the plugins that
        installed distributions declare)."""

        @classmethod
        def find_distributions(cls, *args, **kwargs):
            for d in super().find_distributions(*args, **kwargs):
                where = os.path.realpath(str(getattr(d, "_path", "")))
                if machine.norm(d.metadata["Name"] or "") in allowed or os.path.dirname(where) not in installed:
                    yield d

    sys.meta_path[:] = [PathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]


_install()
