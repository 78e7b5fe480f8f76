"""Fleet's Docker hosts as the nodes of a Ray cluster, and whether it lets in a process without its token."""
