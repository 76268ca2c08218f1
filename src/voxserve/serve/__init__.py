"""HTTP server: create_app(engine), schemas, metrics, `voxserve serve`."""
