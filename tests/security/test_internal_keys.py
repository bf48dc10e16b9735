"""The cluster's internal identity in a keys directory (fabric/security/keys.py): made by init,
added to a directory made before it without touching the rest, a name no client can take."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.errors import BadParameter, ConfigError
from fabric.security import keys


def test_init_makes_the_internal_pair_allowed_as_its_own_principal(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k")
    assert (d / "internal.key_secret").stat().st_mode & 0o777 == 0o600
    public, secret = keys.internal_pair(d)
    assert secret and keys.client_keys(d) == {public: keys.INTERNAL}
    keys.add_client(d, "alice")
    listed = keys.list_clients(d)
    assert [(c["name"], c["state"]) for c in listed] == [("alice", "allowed"), (keys.INTERNAL, "internal")]


@pytest.mark.parametrize("name", ["__internal", "__x"])
def test_reserved_names_are_refused(tmp_path: Path, name: str) -> None:
    d = keys.init(tmp_path / "k")
    with pytest.raises(BadParameter, match="fabric's own"):
        keys.add_client(d, name)
    with pytest.raises(BadParameter, match="fabric's own"):
        keys.revoke(d, name)
    assert keys.has_internal(d)


def test_a_dir_made_before_the_internal_identity_gets_it_and_keeps_the_rest(tmp_path: Path) -> None:
    d = keys.init(tmp_path / "k")
    keys.add_client(d, "alice")
    (d / "internal.key_secret").unlink()
    (d / "clients" / f"{keys.INTERNAL}.key").unlink()
    with pytest.raises(ConfigError, match="fabric auth init"):
        keys.internal_pair(d)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    keys.init(d)
    after = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert {p: b for p, b in after.items() if p in before} == before  # nothing else touched
    assert set(after) - set(before) == {d / "internal.key_secret", d / "clients" / f"{keys.INTERNAL}.key"}
    assert keys.internal_pair(d)[1]
    with pytest.raises(ConfigError, match="already holds"):
        keys.init(d)
