"""Ladder protos."""
