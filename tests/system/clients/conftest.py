"""One supervisor for the whole hostile-client package: every case here is a request, none needs its own server.

Not parametrized over launchers (the requests never reach a worker that matters): the default fork server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Server, start_server, stop_server

# Enough operations that each one's input bounds are reached (disabled ones answer 403 before 422); train
# stays off so that 403 has a row too.
OPERATIONS = "run,batch_run,test,knowledge_query,memory_reset"


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("clients") / "s", env={"AIP_CREWAI_ALLOWED_OPERATIONS": OPERATIONS})
    yield running
    stop_server(running)
