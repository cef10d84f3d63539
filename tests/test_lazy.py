"""trtforge._lazy: the packages whose public names load their modules on first use."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from trtforge._lazy import lazy_attributes

# package -> (a public name, the module it comes from)
LAZY_PACKAGES = {
    "trtforge.runtime": ("load", "trtforge.runtime.engine"),
    "trtforge.calibration": ("calibrate_model", "trtforge.calibration.api"),
    "trtforge.passes.precision": ("convert_precision", "trtforge.passes.precision.convert"),
}


def test_a_listed_name_imports_its_module_and_an_unlisted_one_raises():
    getattr_ = lazy_attributes("pkg", {"join": "os.path"})
    import os.path

    assert getattr_("join") is os.path.join
    with pytest.raises(AttributeError, match=r"^module 'pkg' has no attribute 'split'$"):
        getattr_("split")


@pytest.mark.parametrize("package", sorted(LAZY_PACKAGES))
def test_each_lazy_package_gives_its_modules_names_and_refuses_others(package):
    name, module = LAZY_PACKAGES[package]
    pkg = importlib.import_module(package)
    assert getattr(pkg, name) is getattr(importlib.import_module(module), name)
    assert name in pkg.__all__
    with pytest.raises(AttributeError, match=rf"^module '{package}' has no attribute 'nope'$"):
        pkg.nope  # noqa: B018


def test_importing_a_lazy_package_loads_none_of_its_modules():
    code = (
        "import importlib, sys\n"
        f"for package, (_, module) in {LAZY_PACKAGES!r}.items():\n"
        "    importlib.import_module(package)\n"
        "    print(module in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"] * len(LAZY_PACKAGES)
