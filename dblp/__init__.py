"""DBLP: a phase-aware bounded-loss gradient transport."""
