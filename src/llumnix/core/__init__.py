"""Dependency-free types shared by every layer (no torch, no ray)."""
