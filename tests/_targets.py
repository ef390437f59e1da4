"""Module-level ``@profiled`` targets for pickling and ``multiprocessing`` tests.

They live in an importable module (not a test file) so that a spawned worker can import them
by name, the way pickle finds any module-level function.
"""

from __future__ import annotations

from instrument import profiled


@profiled
def square(x):
    """Square x."""
    return x * x


@profiled("targets.cube")
def cube(x):
    return x * x * x


@profiled
def countdown(n):
    while n > 0:
        yield n
        n -= 1
    return "liftoff"


@profiled
async def add_async(a, b):
    return a + b


def apply(fn, x):
    """Runs in the worker: call a function that arrived pickled; report what the worker saw."""
    return fn(x), fn.__name__, hasattr(fn, "__wrapped__")
