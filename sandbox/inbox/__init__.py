"""Programs that run inside boxes, not on the host.

Every file here runs in a container: the box agent (:mod:`.boxagent`, which serves
the host's exec and file requests), the operations it speaks (:mod:`.wire`, which
the host imports too) and the egress proxy (:mod:`.egress_proxy`, the way out of a
run's network, and :mod:`.egress_rules`, its rules, which the host imports too) and
the workspace's stamps print (:mod:`.stamps`, which the agent and Fleet's in-box git
program share).
They use the standard library only, because a box has ``python3`` and nothing
else, and the image build copies each of them, flat, into every Fleet image at
``/opt/fleet`` (:data:`sandbox.images.catalog.BOX_HELPERS`).

The host never runs them; it imports only their pure rules and types (the proxy's
allowlist and address checks, which a job file is validated against before any box
starts). Keeping them in one folder makes the line visible: a change here changes
every image's tag, and nothing here may import from the rest of ``sandbox``.
"""
