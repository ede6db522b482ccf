"""agentctl's commands, one module per group of them.

:data:`agentctl.cli.COMMANDS` names the module of each command; a module is
imported only when one of its commands runs, or when help lists them.
"""
