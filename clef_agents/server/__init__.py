"""The Jev-compatible decision server: ``/v1/systemone`` over a local engine.

Needs the ``[server]`` extra (FastAPI, uvicorn, zstandard, prometheus-client)::

    pip install 'clef-agents[server]'

Example:
    A real server passes ``DecisionEngine()``; ``FakeEngine`` needs no model.

    >>> from clef_agents.fake import FakeEngine
    >>> from clef_agents.server import ServerConfig, create_app
    >>> app = create_app(FakeEngine(), ServerConfig(max_batch=64, max_wait_ms=2))
    >>> sorted(route.path for route in app.routes if route.path.startswith("/v1"))
    ['/v1/models', '/v1/systemone', '/v1/systemone/batch']
"""

from __future__ import annotations

from clef_engine.errors import require

for _module, _package in (
    ("fastapi", "fastapi"),
    ("uvicorn", "uvicorn"),
    ("zstandard", "zstandard"),
    ("prometheus_client", "prometheus-client"),
    ("python_multipart", "python-multipart"),
):
    require(_module, package=_package, extra="server", feature="The decision server")

from clef_agents.server.app import REQUEST_ID_HEADER, ServerState, create_app  # noqa: E402
from clef_agents.server.batcher import MicroBatcher, Overloaded  # noqa: E402
from clef_agents.server.config import ServerConfig  # noqa: E402

__all__ = [
    "REQUEST_ID_HEADER",
    "MicroBatcher",
    "Overloaded",
    "ServerConfig",
    "ServerState",
    "create_app",
]
