"""The Lua scripts shipped in the package are byte-for-byte the Rust crate's (their single
source, crates/redsem/src/scripts). Fix a failure with clients/python/sync-scripts.sh."""

import pathlib
from importlib import resources

import pytest

HERE = pathlib.Path(__file__).resolve().parent
CRATE = HERE.parents[2] / "crates" / "redsem" / "src" / "scripts"
SOURCE = HERE.parent / "src" / "redsem" / "scripts"


def _lua(d: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.lua"))}


@pytest.mark.skipif(not CRATE.is_dir(), reason="not run from the redsem repository")
def test_package_scripts_are_the_crates():
    crate = _lua(CRATE)
    assert crate, CRATE
    assert _lua(SOURCE) == crate, "run clients/python/sync-scripts.sh"


@pytest.mark.skipif(not CRATE.is_dir(), reason="not run from the redsem repository")
def test_installed_scripts_are_the_crates():
    installed = resources.files("redsem") / "scripts"
    crate = _lua(CRATE)
    got = {name: (installed / name).read_bytes() for name in crate}
    assert got == crate, "the installed package is stale: reinstall it (scripts/install-deps.sh)"
