"""The steward's side: the office (the lease), the steward thread, liveness."""
