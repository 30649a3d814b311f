"""The rendezvous's model: node descriptors, the state, and the pure decisions."""
