"""Fleet's images: what they are (catalog), how they are built and shipped."""
