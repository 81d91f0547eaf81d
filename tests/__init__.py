"""The test suite (tests/storage, tests/server, tests/e2e, tests/control); helpers in tests/support."""
