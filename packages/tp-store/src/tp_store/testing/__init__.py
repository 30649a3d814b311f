"""Test helpers for stores: the Store contract suite (needs pytest)."""
