"""`python -m service [flags]`: the same as `ladder serve`."""

import asyncio
import sys

from service.config import load_config

config = load_config(argv=sys.argv[1:])  # a bad flag exits 2 here, before the server's imports
from service.server import serve  # noqa: E402

raise SystemExit(asyncio.run(serve(config)))
