"""Errors of the reconciler, under the library's root `CkitError`."""

from __future__ import annotations

from consumer_kit.errors import CkitError


class ReconcileError(CkitError):
    """The reconcile run failed (a Spark job, a JDBC read). Repairs already committed stay:
    every one of them is a compare-and-set, so running again is safe."""
