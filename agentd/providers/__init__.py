"""Provider adapters, one module (or package) per runtime.

Each implements :class:`agentd.contract.Provider`: ``script`` (in-process TOML
replay, always available), ``copilot``, ``claude`` and ``acp``. Providers know
nothing of sockets or the journal; they report through an
:class:`agentd.contract.EventSink`.
"""
