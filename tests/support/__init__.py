"""Support shared by the tests and the benchmark harness; never shipped in the package."""
