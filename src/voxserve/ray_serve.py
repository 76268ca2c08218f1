"""`voxserve.ray_serve:build_app`, the import path that Serve config files written by earlier
`voxserve ray-config` name; the module is voxserve.serve.ray."""

from .serve.ray import build_app

__all__ = ["build_app"]
