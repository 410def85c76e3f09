"""Serving experiment: workload, streaming client, metrics, and a mock server for tests and benches."""
