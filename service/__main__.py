"""`python -m service [flags]`: the same as `ladder serve`."""

import sys

from service.entry import main

raise SystemExit(main(sys.argv[1:]))
