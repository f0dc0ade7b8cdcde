"""Test fixtures that ship with the package: small random-weight checkpoints and synthetic audio.

May import `realtime` only.
"""
