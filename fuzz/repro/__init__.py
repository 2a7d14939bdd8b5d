"""From a finding to something a person can act on: repro bundles (shrunk, replayable, with pictures), seeded
campaigns over the oracles, coverage-guided fuzzing of the files the toolkit reads."""
