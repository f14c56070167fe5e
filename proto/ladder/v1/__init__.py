"""Ladder API v1: generated protobuf and gRPC stubs (see proto/generate.py)."""
