"""One isolated box, on whichever backend makes it.

At the top, what every backend shares: the contract (:mod:`.base`, with its errors in
:mod:`.errors` and the box's settings in :mod:`.spec`), the registry that is the one
door to a backend (:mod:`.registry`), and what works over any backend - warm pools
(:mod:`.pool`, :mod:`.warm`), a box still starting (:mod:`.deferred`), a long-lived
process in a box (:mod:`.process`), the workspace's stamps (:mod:`.watch`).

The rooms: ``docker/`` the Docker backend (engine, containers, networks, the transport
to a box's agent, gVisor, the host firewall, labels and gc); ``images/`` Fleet's
images (what they are, their offline build, shipping them to cluster nodes); ``cli/``
the layer's commands (``fleet setup``, ``images``, ``doctor``, ``sandbox ls | gc``);
``cluster/`` Docker hosts as the nodes of a Ray cluster and its token check;
``inbox/`` the stdlib-only programs that run inside boxes.
"""
