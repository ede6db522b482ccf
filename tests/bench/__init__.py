"""agentd's benchmark suite: ``python -m tests.bench`` (``--quick`` for CI); see run.py."""
