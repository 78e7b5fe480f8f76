"""What a person sees of a run and answers: the live progress table (``progress``), the
queue of the tool policies' asks (``approvals``), and hostile text made visible on a
terminal (``visible``).

Kept low so that the run, a lead and ``fleet trace``/``fleet approve`` share one queue
and one way of showing text; it imports no other room.
"""
