"""Benchmark prompt sets and the seeded generator of the 500-prompt set (see README.md here)."""
