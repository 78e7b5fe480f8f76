"""The agent loop's core: one member's turns, from its task to a result or a limit.

:mod:`.loop` runs the turns; :mod:`.conversation` holds the messages and saves them
through :mod:`.transcript` (appended and group-committed, read back on resume);
:mod:`.tool_calls` runs one response's tool calls; :mod:`.closing` makes the one closing
call that turns a member stopped by a limit into a partial result.
"""
