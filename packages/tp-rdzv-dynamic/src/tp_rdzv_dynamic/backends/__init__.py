"""Where the state document lives: the backend interface, its store implementations, the holder."""
