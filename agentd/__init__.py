"""agentd: a supervisor daemon for AI coding-agent runtimes.

Import-light on purpose: neither trio nor structlog is imported here, so the
``agentctl`` client (which imports :mod:`agentd.wire`) starts fast.
"""

__version__ = "0.1.0"
