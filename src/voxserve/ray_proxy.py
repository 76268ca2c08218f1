"""`voxserve.ray_proxy:proxy_middlewares`, the import path that earlier docs had clusters set in
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH; the module is voxserve.serve.ray_proxy."""

from .serve.ray_proxy import proxy_middlewares

__all__ = ["proxy_middlewares"]
