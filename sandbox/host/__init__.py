"""What Fleet keeps on the host's own file system while it works for its boxes.

:mod:`sandbox.host.scratch`: temporary directories (a repository's staged copy, a
node's scratch space, an image build's context and rootfs) that a process killed
outright does not leave behind for good.
"""
