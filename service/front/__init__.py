"""A call's side, whatever the protocol (gRPC or HTTP, in the server's process or a frontend's): the
Front, the generate path, token ids into text and stop strings, the call's record (progress), tool
calls and their formats. Below it: service/core/ (orders)."""
