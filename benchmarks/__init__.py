"""Benchmarks, grouped by what they measure; each runs as a module from the checkout's root:
``python -m benchmarks.node.reconcile_cycle`` (README.md lists them)."""
