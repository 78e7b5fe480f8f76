"""The box agent's program in a Fleet image: ``python3 -I -S /opt/fleet/boxagent_main.py``.

Python compiles the file it is given as its program on every start and keeps nothing of
that; a module it imports it reads from bytecode when ``__pycache__`` holds it. A box's
root is read-only, so that bytecode is written when the image is built (``compileall``
in each image's Dockerfile) or never. Run as the program, the agent's 40 KB of source
and its three modules were compiled again by every box and every restarted agent: about
a third of the agent's start in CPU (``bench/box_start.py --parts agent``). So the
program is these lines and the agent (:mod:`sandbox.inbox.boxagent`) is imported.

``-I`` keeps this file's directory off ``sys.path``; it is put there for the import, as
:mod:`sandbox.inbox.boxagent` does for its own modules.
"""

import sys

TYPE_CHECKING = False  # not typing's: importing typing costs the start this file is for
if TYPE_CHECKING:
    from . import boxagent
elif __name__ == "__main__":
    sys.path.insert(0, __file__.rpartition("/")[0])
    import boxagent

    sys.exit(boxagent.main(sys.argv[1:]))
