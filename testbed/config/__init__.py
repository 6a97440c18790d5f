"""Experiment specs and presets: what a run is, validated once."""
