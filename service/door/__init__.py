"""The door every call passes, whatever its protocol: its record and request id (call_context.py),
the call log that counts it in flight and writes its one line (call_log.py), and who may call
(callers.py). gRPC's interceptors (service/interceptors/) and the HTTP app's middleware
(service/http/app.py) adapt it to their protocol; neither imports the other.
"""
