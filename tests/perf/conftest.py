"""The perf tests use the worker tests' helpers (small digit sets, running the worker)."""

from tests.worker.conftest import small_digits

__all__ = ["small_digits"]
