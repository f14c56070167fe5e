"""The gRPC side: the servicer, protobuf in and out (wire), requests parsed inside the call,
reflection, and one process's grpc.aio server (door)."""
