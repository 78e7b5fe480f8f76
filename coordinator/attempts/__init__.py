"""A coding member's parallel attempts and the choice among them
(:mod:`.attempts`, :mod:`.selection`)."""
