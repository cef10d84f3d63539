"""register_creator_once: one creator per (registry, plugin), kept alive by trtforge; refusals are UserErrors.

Runs with a stand-in backend: registration logic is ours, TensorRT only stores the creator."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trtforge.errors import UserError
from trtforge.plugins.attention.plugin import register_creator_once


class _Registry:
    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.calls: list[tuple[object, str]] = []

    def register_creator(self, creator: object, namespace: str) -> bool:
        self.calls.append((creator, namespace))
        return self.accept


def _backend(registry: _Registry) -> SimpleNamespace:
    caps = SimpleNamespace(can_host_plugins=True, plugin_reason="")
    return SimpleNamespace(capabilities=caps, trt=SimpleNamespace(get_plugin_registry=lambda: registry))


def _classes(tag: str):
    class Creator:
        name = tag

    return lambda backend: (object, Creator)


def test_each_plugin_registers_once_per_registry() -> None:
    registry = _Registry()
    backend = _backend(registry)
    a1 = register_creator_once(backend, _classes("A"), "ns::A")
    a2 = register_creator_once(backend, _classes("A"), "ns::A")
    b = register_creator_once(backend, _classes("B"), "ns::B")
    assert a1 is a2 and a1.name == "A" and b.name == "B"
    assert [c.name for c, _ in registry.calls] == ["A", "B"]
    other = _Registry()
    assert register_creator_once(_backend(other), _classes("A"), "ns::A") is not a1
    assert len(other.calls) == 1


def test_a_refused_registration_is_a_user_error_and_not_cached() -> None:
    registry = _Registry(accept=False)
    backend = _backend(registry)
    with pytest.raises(UserError, match=r"refused to register plugin ns::C"):
        register_creator_once(backend, _classes("C"), "ns::C")
    registry.accept = True
    assert register_creator_once(backend, _classes("C"), "ns::C").name == "C"
    assert len(registry.calls) == 2
