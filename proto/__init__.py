"""The public API: .proto sources and their generated Python stubs (package proto.ladder.v1)."""
