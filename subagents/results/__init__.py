"""What a member hands back: its result, the job's own result fields, its outcome.

:mod:`.result` checks and sizes the final answer the model submits; :mod:`.result_schema`
reads a job's ``result_schema`` and extends a kind's result model with it; :mod:`.outcome`
is how a member ended (status, reason, result, usage), the shape every report, journal
entry and API reads; :mod:`.member_text` turns a result into the words a lead or an
analyst reads.
"""
