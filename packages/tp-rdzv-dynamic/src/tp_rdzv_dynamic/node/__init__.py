"""The node's side: ticks and heartbeats, bootstrap, rollback, closing, argument checks."""
