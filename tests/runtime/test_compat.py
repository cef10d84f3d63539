"""Backend name/version rules and required-plugin registration."""

from __future__ import annotations

import sys
import types

import pytest

from trtforge.errors import UserError
from trtforge.runtime import compat
from trtforge.runtime.compat import check_backend_compat, register_required_plugins


def _check(built, name, version, vc=False):
    check_backend_compat(built, name, version, version_compatible=vc, engine="engine 'm.engine'")


class TestBackendCompat:
    def test_same_release_passes_build_number_ignored(self):
        _check({"name": "tensorrt_rtx", "version": "1.7.1.116"}, "tensorrt_rtx", "1.7.1.200")
        _check({"name": "tensorrt", "version": "11.1.0"}, "tensorrt", "11.1.0.7")

    def test_other_backend_is_refused_with_the_fix(self):
        with pytest.raises(
            UserError,
            match=r"built with tensorrt 11\.1\.0.*here is tensorrt_rtx 1\.7\.1.*"
            r"TRTFORGE_BACKEND=tensorrt",
        ):
            _check({"name": "tensorrt", "version": "11.1.0"}, "tensorrt_rtx", "1.7.1")

    def test_rtx_releases_do_not_mix(self):
        with pytest.raises(UserError, match=r"not compatible across RTX releases.*tensorrt-rtx==1\.6\.0"):
            _check({"name": "tensorrt_rtx", "version": "1.6.0"}, "tensorrt_rtx", "1.7.1")

    def test_trt_needs_exact_version_unless_version_compatible(self):
        with pytest.raises(UserError, match="unless built version-compatible"):
            _check({"name": "tensorrt", "version": "11.0.0"}, "tensorrt", "11.1.0")
        _check({"name": "tensorrt", "version": "11.0.0"}, "tensorrt", "11.1.0", vc=True)
        _check({"name": "tensorrt", "version": "10.12.0"}, "tensorrt", "11.1.0", vc=True)

    def test_version_compatible_limits(self):
        with pytest.raises(UserError, match=r"8->10, 10->11"):
            _check({"name": "tensorrt", "version": "8.6.1"}, "tensorrt", "11.1.0", vc=True)
        with pytest.raises(UserError, match="cannot run it"):
            _check({"name": "tensorrt", "version": "11.2.0"}, "tensorrt", "11.1.0", vc=True)

    def test_unparseable_version(self):
        with pytest.raises(UserError, match="cannot compare backend versions"):
            _check({"name": "tensorrt", "version": "unknown"}, "tensorrt", "11.1.0")


class TestPlugins:
    KEYS = ({"name": "FlashAttention", "version": "1", "namespace": "trtforge"},)

    def test_no_plugins_needs_nothing(self):
        register_required_plugins([], object(), lambda keys: pytest.fail("registry queried"))

    def test_provider_is_called_then_registry_checked(self, monkeypatch):
        calls = []
        mod = types.ModuleType("fake_plugins")
        mod.register_plugins = lambda backend: calls.append(backend)
        monkeypatch.setitem(sys.modules, "fake_plugins", mod)
        monkeypatch.setitem(compat.PLUGIN_PROVIDERS, "trtforge", "fake_plugins:register_plugins")
        backend = types.SimpleNamespace(name="tensorrt")
        register_required_plugins(self.KEYS, backend, lambda keys: [])
        assert calls == [backend]

    def test_missing_creator_is_a_clear_error(self, monkeypatch):
        mod = types.ModuleType("fake_plugins")
        mod.register_plugins = lambda: None
        monkeypatch.setitem(sys.modules, "fake_plugins", mod)
        monkeypatch.setitem(compat.PLUGIN_PROVIDERS, "trtforge", "fake_plugins:register_plugins")
        with pytest.raises(
            UserError, match=r"FlashAttention v1 \(namespace 'trtforge'\).*not registered with tensorrt"
        ):
            register_required_plugins(
                self.KEYS, types.SimpleNamespace(name="tensorrt"), lambda keys: list(keys)
            )

    def test_unimportable_provider_fails_clearly(self, monkeypatch):
        monkeypatch.setitem(
            compat.PLUGIN_PROVIDERS, "trtforge", "trtforge_no_such_module.plugin:register_plugins"
        )
        with pytest.raises(UserError, match="needs trtforge plugins .* cannot be imported"):
            register_required_plugins(self.KEYS, object(), lambda keys: [])

    def test_foreign_namespace_only_checks_the_registry(self):
        keys = [{"name": "Other", "version": "2", "namespace": "vendor"}]
        with pytest.raises(UserError, match=r"Other v2 \(namespace 'vendor'\)"):
            register_required_plugins(keys, object(), lambda k: list(k))
