"""The volunteer's node."""
