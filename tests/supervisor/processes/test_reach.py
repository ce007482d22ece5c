"""How a refusal of ``WORKER_USER`` finds what the user may not pass (supervisor/processes/reach.py): by the modes
on the way, links followed as the kernel follows them, in the class (owner, group, other) that applies to the
user. Read from the files' modes only, so it needs no root: the user is one that owns none of them."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.processes.reach import READ, SEARCH, Denied, _chmod, _walk

STRANGER = (54321, 54321)  # owns nothing here, and is in none of its groups


def test_a_link_is_followed_to_the_place_on_its_way_and_each_place_is_named_once(base: Path) -> None:
    """As a venv's ``bin/python`` links into a Python under ``/root``: the closed place is on the target's way,
    not the link's; a relative link with ``..`` resolves from where the link is."""
    (base / "closed" / "lib").mkdir(parents=True)
    (base / "closed").chmod(0o700)
    module = base / "closed" / "lib" / "os.py"
    module.write_text("")
    module.chmod(0o600)
    (base / "venv").mkdir(mode=0o755)
    (base / "venv" / "lib").symlink_to("../closed/lib")
    denied = _walk(str(base / "venv" / "lib" / "os.py"), STRANGER, READ)
    assert [(d.path, d.bits) for d in denied] == [(str(base / "closed"), SEARCH), (str(module), READ)]
    assert denied[0].said() == f"it may not traverse {base / 'closed'} (owner {_owner(base)}, mode 0700)"
    assert _chmod(denied, STRANGER) == f"chmod o+x {base / 'closed'} && chmod o+r {module}"


def test_the_class_that_applies_is_the_users_group_where_the_place_is_its_groups(base: Path) -> None:
    """A place of the user's group that grants others but not the group is closed to it (the group's bits
    apply): the fix opens the group's bits, not everyone's."""
    place = base / "groups"
    place.mkdir()
    place.chmod(0o705)
    ours = (STRANGER[0], os.stat(place).st_gid)
    assert _walk(str(place / "x"), STRANGER, READ) == []  # others may traverse: it is not there, nothing else
    [denied] = _walk(str(place / "x"), ours, READ)
    assert denied.path == str(place) and _chmod([denied], ours) == f"chmod g+x {place}"
    listed = Denied(str(place), os.stat(place), READ | SEARCH)
    assert listed.said().startswith(f"it may not list {place} ") and _chmod([listed], ours) == f"chmod g+rx {place}"


def _owner(path: Path) -> str:
    info = os.stat(path)
    return f"{info.st_uid}:{info.st_gid}"
