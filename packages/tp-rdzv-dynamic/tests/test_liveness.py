"""Liveness from heartbeat progress, judged on the observer's clock."""

from __future__ import annotations

from tp_rdzv_dynamic.steward.liveness import LivenessTracker


def test_a_counter_that_stops_is_silent_after_the_bound():
    tracker = LivenessTracker(bound=3.0)
    assert tracker.observe({"a": 1, "b": 1}, now=100.0) == []
    assert tracker.observe({"a": 2, "b": 1}, now=101.0) == []
    assert tracker.observe({"a": 3, "b": 1}, now=102.9) == []
    assert tracker.observe({"a": 4, "b": 1}, now=103.0) == ["b"]
    assert tracker.observe({"a": 4, "b": 1}, now=105.9) == ["b"]
    assert tracker.observe({"a": 4, "b": 1}, now=106.0) == ["a", "b"]


def test_progress_resets_the_clock():
    tracker = LivenessTracker(bound=2.0)
    tracker.observe({"a": 1}, now=0.0)
    assert tracker.observe({"a": 1}, now=1.9) == []
    assert tracker.observe({"a": 2}, now=2.5) == []
    assert tracker.observe({"a": 2}, now=4.4) == []
    assert tracker.observe({"a": 2}, now=4.5) == ["a"]


def test_a_node_seen_for_the_first_time_gets_the_full_bound():
    tracker = LivenessTracker(bound=2.0)
    tracker.observe({"a": 5}, now=10.0)
    assert tracker.observe({"a": 5, "new": 1}, now=11.0) == []
    assert tracker.observe({"a": 5, "new": 1}, now=12.5) == ["a"]
    assert tracker.observe({"a": 5, "new": 1}, now=13.0) == ["a", "new"]


def test_absent_keys_are_forgotten():
    tracker = LivenessTracker(bound=1.0)
    tracker.observe({"a": 1}, now=0.0)
    tracker.observe({}, now=5.0)
    assert tracker.observe({"a": 1}, now=5.5) == []


def test_counters_are_only_compared_for_equality():
    # A heartbeat is whatever the store holds (bytes); no value is ever read as a time.
    tracker = LivenessTracker(bound=1.0)
    tracker.observe({"a": b"17"}, now=0.0)
    assert tracker.observe({"a": b"18"}, now=0.9) == []
    assert tracker.observe({"a": b"18"}, now=1.8) == []
    assert tracker.observe({"a": b"18"}, now=2.0) == ["a"]
