"""Prepared boxes: a repository's setup run once per key, its result kept on the engine.

:mod:`.spec` is what a setup may say; :mod:`.key` what makes two setups the same one;
:mod:`.capture` what of a finished setup's ``/workspace`` is kept (and what never is);
:mod:`.prepare` runs a setup once per key and hands members its snapshot. A backend
stores and lists the snapshots (:mod:`sandbox.docker.prepared` on Docker).
"""
