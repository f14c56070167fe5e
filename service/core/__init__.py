"""The core: its orders (orders), answered in process (core) or over a socket (core_link); what every
call shares and each caller holds (serving), sessions, constraints, the count of the work
(counting). Below it: service/worker/."""
