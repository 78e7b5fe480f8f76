"""What a member may do: tool policies and delegation.

:mod:`.policy` decides, call by call, whether a tool call runs, is refused or waits for a
person's answer; :mod:`.delegation` is the seam through which a lead's tools start and
wait on members.
"""
