"""Helpers the test files share (the NumPy references are in `reference.py`)."""

from __future__ import annotations

from typing import Any


def accelerators_form(*args: Any, cpu: Any, accelerator: Any) -> Any:
    """`jaxbuf._lowering.choose` as a program lowered for a GPU or TPU runs it: patched
    in, a test runs the accelerators' forms on this CPU."""
    return accelerator(*args)
