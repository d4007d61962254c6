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


def test_the_name_leaves_out_where_tensorflow_is_and_keeps_its_abi_flags():
    """A copy built in another environment with the same TensorFlow has the same name (the
    wheel's prebuilt copies are found by it); another ABI flag or version does not."""
    def tf(version: str, include: str, lib: str, abi: str = "1") -> SimpleNamespace:
        return SimpleNamespace(__version__=version, sysconfig=SimpleNamespace(
            get_compile_flags=lambda: [f"-I{include}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"],
            get_link_flags=lambda: [f"-L{lib}", "-l:libtensorflow_framework.so.2"]))
    here = _native.library_name(tf("2.21.0", "/a/tensorflow/include", "/a/tensorflow"))
    assert here == _native.library_name(tf("2.21.0", "/b/site/tf/include", "/b/site/tf"))
    assert here != _native.library_name(tf("2.21.0", "/a/tensorflow/include", "/a/tensorflow",
                                           abi="0"))
    assert here != _native.library_name(tf("2.20.0", "/a/tensorflow/include", "/a/tensorflow"))


def test_the_wheels_copy_after_the_sites_and_before_the_users_cache(dirs, tmp_path, monkeypatch):
    site, user = dirs
    packaged = tmp_path / "prebuilt"
    packaged.mkdir()
    monkeypatch.setattr(_native, "PREBUILT_DIR", packaged)
    monkeypatch.setenv("PATH", "/nonexistent")            # no compiler on this node
    name = _native.library_name(FAKE_TF)
    (packaged / name).write_bytes(b"")
    assert _native.build(FAKE_TF) == packaged / name      # found: nothing is compiled
    monkeypatch.setenv("MALLEABLE_TF_PREBUILT", "0")
    assert _native.library_path(FAKE_TF) == user / name
    monkeypatch.delenv("MALLEABLE_TF_PREBUILT")
    (site / name).write_bytes(b"")
    assert _native.library_path(FAKE_TF) == site / name


@pytest.mark.usefixtures("dirs")
def test_a_refusal_the_wheel_carries_leads_to_its_parking_only_copy(tmp_path, monkeypatch):
    """Built for a TensorFlow the full library does not build against, the wheel carries the
    refusal and the parking-only copy: a node without a compiler takes that copy."""
    packaged = tmp_path / "prebuilt"
    packaged.mkdir()
    monkeypatch.setattr(_native, "PREBUILT_DIR", packaged)
    monkeypatch.setenv("PATH", "/nonexistent")
    full = _native.library_name(FAKE_TF)
    parking = _native.library_name(FAKE_TF, parking_only=True)
    (packaged / (full + ".failed")).write_text("split_width.cc: error: no member")
    (packaged / parking).write_bytes(b"")
    assert _native.build_for_this_tensorflow(FAKE_TF) == (packaged / parking, True)
