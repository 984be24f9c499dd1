from __future__ import annotations

from clef_agents.cli import main

raise SystemExit(main())
