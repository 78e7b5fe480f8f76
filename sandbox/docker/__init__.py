"""The Docker backend: one container per box, driven through an in-box agent."""
