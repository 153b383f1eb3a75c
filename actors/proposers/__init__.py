"""Proposers: every way specray guesses tokens ahead (base.py declares the interface)."""
