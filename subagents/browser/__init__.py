"""The browser member's machinery: a CDP session to the member's own box, page views,
and the page texts it fetched (for quote verification). Tools live in
:mod:`subagents.tools.browser`, the kind in :mod:`subagents.kinds.browser`."""
