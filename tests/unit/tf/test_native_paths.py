"""Where the native library is looked for: the environment's site copy (built by
``python -m malleable_tf.build``) before the user's cache, its refusal note included, so a
compute node without a compiler takes the site's parking-only copy rather than compiling."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from malleable_tf import _native

FAKE_TF = SimpleNamespace(__version__="2.99.0", sysconfig=SimpleNamespace(
    get_compile_flags=lambda: ["-I/tf/include"], get_link_flags=lambda: ["-L/tf"]))


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    site, user = tmp_path / "site", tmp_path / "user"
    site.mkdir()
    monkeypatch.setattr(_native, "site_cache_dir", lambda: site)
    monkeypatch.setenv("MALLEABLE_CACHE", str(user))
    return site, user / "native"


def test_the_site_copy_comes_first_and_else_the_users_cache(dirs):
    site, user = dirs
    name = _native.library_name(FAKE_TF)
    assert _native.library_path(FAKE_TF) == user / name
    (site / name).write_bytes(b"")
    assert _native.library_path(FAKE_TF) == site / name
    assert _native.build(FAKE_TF) == site / name          # there: nothing is compiled


def test_a_refusal_noted_in_the_site_copy_is_not_compiled_again_on_a_node(dirs, monkeypatch):
    site, _ = dirs
    name = _native.library_name(FAKE_TF)
    (site / (name + ".failed")).write_text("split_width.cc: error: no member")
    monkeypatch.setenv("PATH", "/nonexistent")            # no compiler on this node
    assert _native.library_path(FAKE_TF) == site / name
    with pytest.raises(_native.CompilerRefused) as refused:
        _native.build(FAKE_TF)
    assert refused.value.earlier and refused.value.note.parent == site


def test_without_a_copy_or_a_compiler_the_message_names_the_build_command(dirs, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(_native.NativeBuildError, match="-m malleable_tf.build"):
        _native.build(FAKE_TF)
