"""TLS contexts parsed before the fork (worker/tls.py): handed out once each, only for exactly what was parsed,
and the same as one built afresh; anything else is built afresh, as without the pool."""

from __future__ import annotations

import os
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path

import certifi
import httpx
import pytest

from worker import tls


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tls.Pool]:
    """A pool of 3 parsed from a copy of certifi's bundle named by SSL_CERT_FILE (``bundle``); ssl is put back
    after the test."""
    bundle = tmp_path / "bundle.pem"
    shutil.copyfile(certifi.where(), bundle)
    monkeypatch.setattr(ssl, "create_default_context", ssl.create_default_context)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)
    made = tls.prepare(3)
    assert made is not None and len(made) == 3
    yield made


def bundle() -> Path:
    return Path(os.environ["SSL_CERT_FILE"])


def test_each_pooled_context_goes_once_then_they_are_built_afresh(pool: tls.Pool) -> None:
    pooled = list(pool._contexts)
    given = [ssl.create_default_context(cafile=str(bundle())) for _ in range(4)]
    assert {id(c) for c in given[:3]} == {id(c) for c in pooled}
    assert id(given[3]) not in {id(c) for c in pooled} and len(pool) == 0


def test_a_pooled_context_is_what_a_fresh_one_would_be(pool: tls.Pool) -> None:
    pooled = ssl.create_default_context(cafile=str(bundle()))
    fresh = tls._original(cafile=str(bundle()))
    assert len(pool) == 2
    for name in ("verify_mode", "check_hostname", "options", "minimum_version", "maximum_version", "verify_flags"):
        assert getattr(pooled, name) == getattr(fresh, name), name
    assert pooled.cert_store_stats() == fresh.cert_store_stats()
    assert pooled.get_ca_certs() == fresh.get_ca_certs()
    assert pooled.get_ciphers() == fresh.get_ciphers()


def test_httpx_takes_them_with_the_environment_it_was_parsed_for(pool: tls.Pool) -> None:
    with httpx.Client(), httpx.Client():
        assert len(pool) == 1


@pytest.mark.parametrize("case", ["another file", "capath", "cadata", "client purpose", "key log", "file changed"])
def test_anything_else_is_built_afresh(pool: tls.Pool, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = bundle()
    other = path.with_name("other.pem")
    shutil.copyfile(path, other)
    if case == "another file":
        context = ssl.create_default_context(cafile=str(other))
    elif case == "capath":
        context = ssl.create_default_context(cafile=str(path), capath=str(path.parent))
    elif case == "cadata":
        context = ssl.create_default_context(cafile=str(path), cadata=other.read_text())
    elif case == "client purpose":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(path))
    elif case == "key log":
        monkeypatch.setenv("SSLKEYLOGFILE", str(path.with_name("keys.log")))
        context = ssl.create_default_context(cafile=str(path))
        assert context.keylog_filename == str(path.with_name("keys.log"))
    else:
        os.utime(path, ns=(0, 0))
        context = ssl.create_default_context(cafile=str(path))
    assert len(pool) == 3
    assert context.cert_store_stats()["x509_ca"] > 0


def test_with_only_a_certificate_directory_there_is_nothing_to_pool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ssl, "create_default_context", ssl.create_default_context)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    assert tls.prepare(3) is None
    assert ssl.create_default_context is tls._original
