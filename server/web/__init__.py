"""HTTP plumbing around the routes: request limits, streaming uploads, Prometheus metrics."""
