"""A pytest plugin: a real supervisor on your crew registry for your tests, and a client on it.

    # pytest --crew-registry my_crews:registry   (or ``crew_registry = my_crews:registry`` in the ini file)
    def test_ready(crew_client):
        assert crew_client.get("/health").json()["status"] == "ready"

``crew_provider`` scripts what the crews' model answers (``supervisor.llm_script``): in a session where a test
uses it, every supervisor started here has its URL in ``CREW_PROVIDER_URL``, as the test's own process has
while the fixture lasts.

Every supervisor it starts is shut down when the fixture that started it ends: SIGTERM, SIGKILL after a
deadline, and each process it had (fork server, workers) confirmed gone; one that outlived it is killed and
fails the test. A thin layer on ``supervisor.testing``, which it imports only once a fixture starts a server:
loading the plugin costs a pytest session nothing. Registered as the ``pytest11`` entry point named as this
module, so that ``-p supervisor.pytest_plugin`` or ``pytest_plugins = ["supervisor.pytest_plugin"]`` beside
the installed entry point registers it once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import httpx

    from supervisor.llm_script import ScriptedProvider
    from supervisor.testing import Server

MARKER = "crew_supervisor"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("crew-supervisor", "crew-supervisor (supervisor.pytest_plugin)")
    group.addoption(
        "--crew-registry",
        dest="crew_registry",
        metavar="MODULE:ATTR",
        help="the crew registry the crew_supervisor fixtures serve (default: the crew_registry ini option)",
    )
    parser.addini("crew_registry", "the crew registry (module:attr) the crew_supervisor fixtures serve")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**options): options of this test's (or module's) crew_supervisor: AIP_CREWAI_* settings "
        "without the prefix (max_concurrency=2), registry=, or supervisor.testing.start's own (env=, args=)",
    )


class Supervisors:
    """Starts supervisors on the session's registry and shuts each down for good.

    ``start`` takes ``supervisor.testing.start``'s keywords (settings named as the ``AIP_CREWAI_*`` variables
    without the prefix, ``env``, ``path``, ``args``, ``wait``…) and ``registry``. Those still running at the
    end of the session are shut down then.
    """

    def __init__(
        self, registry: str | None, states: pytest.TempPathFactory, path: list[Path], scripted: bool = False
    ) -> None:
        self.registry = registry
        self.running: list[Server] = []
        self.scripted = scripted  # whether the supervisors reach the scripted provider (a test uses crew_provider)
        self._provider: ScriptedProvider | None = None
        self._states = states
        self._path = path  # where the tests import from: the supervisor imports the registry from there too

    def start(self, state: Path | None = None, **options: Any) -> Server:
        """A supervisor on ``state`` (a fresh directory by default), ready unless ``wait=False``."""
        from supervisor import testing  # here, not at the top: the plugin loads in every session of its user
        from supervisor.llm_script import URL_ENV

        registry = options.pop("registry", None) or self.registry
        if not registry:
            reason = f"no crew registry: give --crew-registry, the crew_registry ini option or {MARKER}(registry=)"
            pytest.fail(reason, pytrace=False)
        state = state or self._states.mktemp("crew-supervisor") / "state"
        scripted = {URL_ENV: self.provider().url} if self.scripted else {}
        env = {**scripted, **(options.pop("env", None) or {})}
        server = testing.start(state, registry, **{"path": self._path, "env": env, **options})
        self.running.append(server)
        return server

    def provider(self) -> ScriptedProvider:
        """The session's scripted provider, started with the first supervisor or ``crew_provider``."""
        if self._provider is None:
            from supervisor.llm_script import ScriptedProvider

            self._provider = ScriptedProvider.start()
        return self._provider

    def close(self) -> None:
        """Shut every supervisor still running down, then stop the provider."""
        try:
            self.stop(*reversed(self.running))
        finally:
            if self._provider is not None:
                self._provider.stop()

    def stop(self, *servers: Server, kill: bool = False) -> None:
        """Shut each down (``kill``: SIGKILL at once, as a crash); fails if any left a process behind (now killed)."""
        left = []
        for server in servers:
            self.running.remove(server)
            left += [f"supervisor pid {server.pid} left {line}" for line in server.shut_down(kill=kill)]
        if left:
            pytest.fail("processes outlived their supervisor (killed now):\n" + "\n".join(left), pytrace=False)


@pytest.fixture(scope="session")
def crew_supervisor_settings() -> Mapping[str, Any]:
    """Options for every supervisor the ``crew_supervisor*`` fixtures start; override it in a conftest.

    The ``crew_supervisor`` markers of the fixture's test, class or module win over it, the closest above all.
    """
    return {}


@pytest.fixture(scope="session")
def crew_supervisor_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervisors]:
    """Starts supervisors of your own (``start``, ``stop``): to restart one on the same state, or run two."""
    config = request.config
    registry = config.getoption("crew_registry") or config.getini("crew_registry") or None
    # Whether a test will script the provider, known before any supervisor starts: every supervisor, of any
    # scope, then points its crews at it, whatever order the fixtures come in.
    scripted = any("crew_provider" in getattr(item, "fixturenames", ()) for item in request.session.items)
    path = [config.rootpath, *config.getini("pythonpath")]
    supervisors = Supervisors(registry, tmp_path_factory, path, scripted)
    yield supervisors
    supervisors.close()


@pytest.fixture
def crew_supervisor(
    request: pytest.FixtureRequest, crew_supervisor_factory: Supervisors, crew_supervisor_settings: Mapping[str, Any]
) -> Iterator[Server]:
    """A supervisor of this test's own (a ``supervisor.testing.Server``), shut down after it."""
    yield from _served(request, crew_supervisor_factory, crew_supervisor_settings)


@pytest.fixture(scope="module")
def crew_supervisor_module(
    request: pytest.FixtureRequest, crew_supervisor_factory: Supervisors, crew_supervisor_settings: Mapping[str, Any]
) -> Iterator[Server]:
    """One supervisor for the test module (its ``pytestmark`` markers apply), shut down after it."""
    yield from _served(request, crew_supervisor_factory, crew_supervisor_settings)


@pytest.fixture(scope="session")
def crew_supervisor_session(
    request: pytest.FixtureRequest, crew_supervisor_factory: Supervisors, crew_supervisor_settings: Mapping[str, Any]
) -> Iterator[Server]:
    """One supervisor for the whole session (no marker applies), shut down at its end."""
    yield from _served(request, crew_supervisor_factory, crew_supervisor_settings)


@pytest.fixture
def crew_client(crew_supervisor: Server) -> Iterator[httpx.Client]:
    """An ``httpx.Client`` on ``crew_supervisor``, with its bearer token."""
    with crew_supervisor.client() as client:
        yield client


@pytest.fixture
def crew_provider(crew_supervisor_factory: Supervisors, monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedProvider]:
    """The scripted provider, its scripts and calls forgotten: ``script`` this test's replies, read its ``calls``.

    Its URL is in ``CREW_PROVIDER_URL`` in every supervisor these fixtures start, and in this process for
    the test (a crew kicked off in the test reaches it too).
    """
    from supervisor.llm_script import URL_ENV

    provider = crew_supervisor_factory.provider()
    provider.reset()
    monkeypatch.setenv(URL_ENV, provider.url)
    yield provider


def _served(request: pytest.FixtureRequest, factory: Supervisors, settings: Mapping[str, Any]) -> Iterator[Server]:
    options = dict(settings)
    for marker in reversed(list(request.node.iter_markers(MARKER))):  # the closest comes first: it must win
        if marker.args:
            pytest.fail(f"{MARKER} takes keywords only, not {marker.args!r}", pytrace=False)
        options.update(marker.kwargs)
    server = factory.start(**options)
    yield server
    factory.stop(server)
