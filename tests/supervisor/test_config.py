"""Settings: reference names and defaults; every bad value fails with one line naming the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.config import ConfigError, load

BASE = {
    "AIP_CREWAI_REGISTRY": "worker.demo:registry",
    "AIP_CREWAI_BEARER_TOKEN": "t0ken",
    "AIP_CREWAI_STATE_FILE": "/x/j.db",
}


def test_defaults_match_the_reference_except_a_loopback_host() -> None:
    s = load({}, BASE)
    assert (s.host, s.port, s.max_concurrency, s.max_retained_runs) == ("127.0.0.1", 8090, 4, 2000)
    assert (s.max_events_per_run, s.max_event_bytes, s.max_state_bytes) == (1000, 262144, 256 * 1024 * 1024)
    assert (s.stream_checkpoint_events, s.allowed_operations, s.token) == (128, ("run",), "t0ken")


@pytest.mark.parametrize(("concurrency", "raw", "prefork"), [("4", "", 2), ("1", "", 1), ("4", "0", 0), ("4", "7", 7)])
def test_prefork_is_sized_from_max_concurrency_unless_set(concurrency: str, raw: str, prefork: int) -> None:
    env = {**BASE, "AIP_CREWAI_MAX_CONCURRENCY": concurrency, "AIP_CREWAI_PREFORK": raw}
    assert load({}, env).prefork == prefork


def test_flags_win_over_environment() -> None:
    assert load({"PORT": "9001"}, {**BASE, "AIP_CREWAI_PORT": "9000"}).port == 9001


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"AIP_CREWAI_MAX_CONCURRENCY": "0"}, "AIP_CREWAI_MAX_CONCURRENCY"),
        ({"AIP_CREWAI_MAX_CONCURRENCY": "four"}, "AIP_CREWAI_MAX_CONCURRENCY"),
        ({"AIP_CREWAI_PREFORK": "65"}, "AIP_CREWAI_PREFORK"),
        ({"AIP_CREWAI_PREFORK": "-1"}, "AIP_CREWAI_PREFORK"),
        ({"AIP_CREWAI_MAX_EVENTS_PER_RUN": "1"}, "AIP_CREWAI_MAX_EVENTS_PER_RUN"),
        ({"AIP_CREWAI_MAX_EVENT_BYTES": "1023"}, "AIP_CREWAI_MAX_EVENT_BYTES"),
        ({"AIP_CREWAI_ALLOWED_OPERATIONS": "run,fly"}, "AIP_CREWAI_ALLOWED_OPERATIONS"),
        ({"AIP_CREWAI_ALLOW_EPHEMERAL": "maybe"}, "AIP_CREWAI_ALLOW_EPHEMERAL"),
        ({"AIP_CREWAI_REGISTRY": ""}, "AIP_CREWAI_REGISTRY"),
        ({"AIP_CREWAI_STATE_FILE": ""}, "AIP_CREWAI_STATE_FILE"),
        ({"AIP_CREWAI_BEARER_TOKEN": ""}, "AIP_CREWAI_BEARER_TOKEN"),
        (
            {"AIP_CREWAI_HOST": "0.0.0.0", "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true"},
            "AIP_CREWAI_ALLOW_UNAUTHENTICATED",
        ),
        ({"AIP_CREWAI_HOST": "0.0.0.0", "AIP_CREWAI_ALLOW_EPHEMERAL": "true"}, "AIP_CREWAI_ALLOW_EPHEMERAL"),
        ({"AIP_CREWAI_BEARER_TOKEN_FILE": "/nonexistent"}, "AIP_CREWAI_BEARER_TOKEN"),
        ({"AIP_CREWAI_ALLOWED_OPERATIONS": "run,train"}, "AIP_CREWAI_TRAINING_DIR"),
        ({"AIP_CREWAI_MAX_RETAINED_RUNS": "2", "AIP_CREWAI_MAX_CONCURRENCY": "3"}, "AIP_CREWAI_MAX_RETAINED_RUNS"),
    ],
)
def test_bad_values_name_their_setting(overrides: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load({}, {**BASE, **overrides})
    assert named in str(caught.value)
    assert "\n" not in str(caught.value)


def test_loopback_may_run_unauthenticated_and_ephemeral() -> None:
    env = {"AIP_CREWAI_REGISTRY": "m:a", "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "1", "AIP_CREWAI_ALLOW_EPHEMERAL": "1"}
    assert load({}, env).token is None


def test_token_file_must_be_private_regular_and_not_a_link(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    env = {**BASE, "AIP_CREWAI_BEARER_TOKEN": "", "AIP_CREWAI_BEARER_TOKEN_FILE": str(token)}
    assert load({}, env).token == "s3cret"
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="0600"):
        load({}, env)
    token.chmod(0o600)
    link = tmp_path / "link"
    os.symlink(token, link)
    with pytest.raises(ConfigError, match="links"):
        load({}, {**env, "AIP_CREWAI_BEARER_TOKEN_FILE": str(link)})
    with pytest.raises(ConfigError, match="only one"):
        load({}, {**env, "AIP_CREWAI_BEARER_TOKEN": "other"})


def test_a_token_on_the_command_line_is_refused_with_the_way_instead() -> None:
    with pytest.raises(ConfigError) as refused:
        load({"BEARER_TOKEN": "s3cret"}, {"AIP_CREWAI_REGISTRY": "m:r", "AIP_CREWAI_STATE_FILE": "/tmp/j.db"})
    assert str(refused.value) == (
        "--bearer-token would put the token where every local user can read it: use --bearer-token-file FILE"
        " (0600) or AIP_CREWAI_BEARER_TOKEN"
    )
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(("mode", "refused"), [(0o700, False), (0o755, False), (0o770, True), (0o703, True)])
def test_crew_env_dir_must_be_writable_by_its_owner_alone(tmp_path: Path, mode: int, refused: bool) -> None:
    directory = tmp_path / "crew-env"
    directory.mkdir()
    directory.chmod(mode)
    env = {**BASE, "AIP_CREWAI_CREW_ENV_DIR": str(directory)}
    if not refused:
        assert load({}, env).crew_env_dir == str(directory)
        return
    with pytest.raises(ConfigError, match=r"AIP_CREWAI_CREW_ENV_DIR=.*others could add a crew's file") as caught:
        load({}, env)
    assert caught.value.fix == f"chmod 700 {directory}"


@pytest.mark.parametrize(("make", "said"), [(None, "No such file"), ("file", "not a directory")])
def test_crew_env_dir_must_be_a_directory(tmp_path: Path, make: str | None, said: str) -> None:
    path = tmp_path / "crew-env"
    if make:
        path.write_text("")
    with pytest.raises(ConfigError, match=said):
        load({}, {**BASE, "AIP_CREWAI_CREW_ENV_DIR": str(path)})


def test_crew_max_concurrency_names_crews_and_the_rest() -> None:
    assert load({}, BASE).crew_max_concurrency == ()  # no crew's own bound: only MAX_CONCURRENCY
    raw = " research = 1, *=2 ,a=b=3,"  # spaces around, an empty part, a crew id holding "="
    assert load({}, {**BASE, "AIP_CREWAI_CREW_MAX_CONCURRENCY": raw}).crew_max_concurrency == (
        ("research", 1),
        ("*", 2),
        ("a=b", 3),
    )


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("research", "'research' is not crew=n (or *=n)"),
        ("=2", "'=2' is not crew=n (or *=n)"),
        ("research=0", "'research=0': n must be a whole number from 1 to 1024"),
        ("research=two", "'research=two': n must be a whole number from 1 to 1024"),
        ("research=-1", "'research=-1': n must be a whole number from 1 to 1024"),
        ("research=1,research=2", "'research' is named twice"),
        ("research=5", "research=5 over AIP_CREWAI_MAX_CONCURRENCY (4)"),
    ],
)
def test_a_bad_crew_max_concurrency_is_refused_in_one_line(raw: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load({}, {**BASE, "AIP_CREWAI_CREW_MAX_CONCURRENCY": raw})
    message = str(refused.value)
    assert "AIP_CREWAI_CREW_MAX_CONCURRENCY" in message and said in message and "\n" not in message


def test_a_trace_ui_url_is_a_template_of_an_http_page() -> None:
    assert load({}, BASE).trace_ui_url == ""  # none: a job's view says no trace_url
    jaeger = " http://localhost:16686/trace/{trace_id} "
    assert load({}, {**BASE, "AIP_CREWAI_TRACE_UI_URL": jaeger}).trace_ui_url == jaeger.strip()
    tempo = "https://grafana.example/explore?left=%7B%22queries%22:%5B%7B%22query%22:%22{trace_id}%22%7D%5D%7D"
    assert load({}, {**BASE, "AIP_CREWAI_TRACE_UI_URL": tempo}).trace_ui_url == tempo


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("http://localhost:16686/trace/", "must be an http:// or https:// URL holding {trace_id}"),
        ("localhost:16686/trace/{trace_id}", "must be an http:// or https:// URL holding {trace_id}"),
        ("javascript:alert(1)//{trace_id}", "must be an http:// or https:// URL holding {trace_id}"),
        ("ftp://traces/{trace_id}", "must be an http:// or https:// URL holding {trace_id}"),
        ("http:///trace/{trace_id}", "must be an http:// or https:// URL holding {trace_id}"),
        ("http://traces/a b/{trace_id}", "must be printable ASCII, without spaces"),
        ("http://traces/\x1b[2J/{trace_id}", "must be printable ASCII, without spaces"),
    ],
)
def test_a_bad_trace_ui_url_is_refused_at_start_in_one_line(raw: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load({}, {**BASE, "AIP_CREWAI_TRACE_UI_URL": raw})
    message = str(refused.value)
    assert message.startswith("AIP_CREWAI_TRACE_UI_URL=") and said in message and "\n" not in message
