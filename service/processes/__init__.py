"""`--frontends N`: the frontend processes as the server runs them (frontends) and a frontend's own
process (frontend); the wire between processes is service/relay.py."""
