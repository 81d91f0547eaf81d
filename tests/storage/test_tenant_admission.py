"""With issued keys, the manager opens only tenants the control database knows."""

from __future__ import annotations

from pathlib import Path

import pytest

from memspine.auth import Authenticator
from memspine_admin.control import ControlDB
from storage.errors import Unauthorized
from storage.tenants.manager import TenantManager


def test_an_erased_tenant_is_not_recreated_by_a_late_request(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ControlDB.init(data, actor="test")
    auth = Authenticator(data, None)
    control = auth.control()  # one environment per process: share the authenticator's
    assert control is not None
    kept = control.create_tenant("kept", actor="test").tenant_id
    gone = control.create_tenant("gone", actor="test").tenant_id
    manager = TenantManager(data, embedding_dim=4, admit=auth.admit_tenant)
    try:
        with manager.use(kept) as tenant:
            assert tenant.tenant_id == kept
        control.delete_tenant(gone, actor="test")
        # A request that authenticated before the delete arrives now: refused, nothing created.
        with pytest.raises(Unauthorized), manager.use(gone):
            pass
        assert not (data / gone).exists()
        assert (data / kept).is_dir()
    finally:
        manager.close_all()
        auth.close()


def test_local_mode_opens_any_valid_tenant(tmp_path: Path) -> None:
    auth = Authenticator(tmp_path, None)
    manager = TenantManager(tmp_path, embedding_dim=4, admit=auth.admit_tenant)
    try:
        with manager.use("acme") as tenant:
            assert tenant.tenant_id == "acme"
        assert (tmp_path / "acme").is_dir()
    finally:
        manager.close_all()
