"""`python -m stream_server ...`: see `stream_server.app`."""

from .app import main

raise SystemExit(main())
