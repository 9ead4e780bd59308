"""llama.cpp compiled for this CPU (`dimmem/llamacpp_native.py`): found only when built for this CPU and
wheel, preferred by the server unless `--portable`, and a build that cannot run or fails says why and
leaves nothing that would be taken for a build.

The build itself compiles for about 15 minutes, so the tests that serve lay out a build folder holding the
installed wheel's own package: what is under test is which folder the server loads llama.cpp from."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from dimmem import llamacpp_native
from dimmem.launch import free_port
from dimmem.llamacpp import llamacpp_service
from dimmem.paths import built_once


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIMMEM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def lay_out_build(key: str | None = None) -> Path:
    """A finished build as `build` leaves it (the wheel's package copied in), stamped for `key`."""
    import xllamacpp

    marker, own = llamacpp_native._marker()

    def copy(marker: Path) -> None:
        shutil.rmtree(marker.parent / "site", ignore_errors=True)
        shutil.copytree(Path(xllamacpp.__file__).parent, marker.parent / "site" / "xllamacpp")
        marker.write_text(own + "\n")

    built_once(marker, key or own, copy)
    return marker.parent / "site"


def test_no_build_means_the_wheel(cache, monkeypatch):
    monkeypatch.delitem(sys.modules, "xllamacpp", raising=False)
    path = list(sys.path)
    llamacpp_native.select()
    assert sys.path == path
    assert not cache.exists()


def test_a_build_for_another_cpu_or_wheel_is_not_used(cache):
    lay_out_build(key="xllamacpp==0.0 cpu=000000000000")
    assert llamacpp_native.built() is None
    site = lay_out_build()
    assert llamacpp_native.built() == site
    for library in (site / "xllamacpp").glob("*.so"):  # a build emptied by hand is not loaded
        library.unlink()
    assert llamacpp_native.built() is None


def test_the_cpu_key_follows_the_instruction_sets(monkeypatch):
    key = llamacpp_native.cpu_key()
    assert len(key) == 12 and key == llamacpp_native.cpu_key()
    monkeypatch.setattr(llamacpp_native.platform, "machine", lambda: "riscv64")
    assert llamacpp_native.cpu_key() != key


def test_a_build_without_its_tools_says_which_and_writes_nothing(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(llamacpp_native.NativeBuildError, match=r"needs cmake \(apt install cmake\)"):
        llamacpp_native.build()
    assert not cache.exists()


def test_a_failed_build_names_its_log_and_leaves_no_build(cache, tmp_path, monkeypatch, capsys):
    """pip cannot find the source (no index): the error carries the log's end; a second try starts over."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    for _ in range(2):
        assert llamacpp_native.main([]) == 2
        err = capsys.readouterr().err
        assert "dimmem llamacpp-native: error: the llama.cpp build failed" in err
        assert "No matching distribution found for xllamacpp" in err
        assert "build.log ends:" in err
    folder = llamacpp_native._marker()[0].parent
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "build.log"]
    assert llamacpp_native.built() is None


@pytest.mark.integration
def test_the_server_loads_the_build_for_this_cpu_unless_portable(cache, tmp_path, qwen3_tokenizer):
    from test_gguf import _tiny_qwen2_with_adapter

    from train.gguf_export import write_gguf

    _tiny_qwen2_with_adapter(tmp_path, qwen3_tokenizer)
    write_gguf(tmp_path / "base", ["f16"], {})
    model = tmp_path / "base" / "model-f16.gguf"
    site = lay_out_build()

    def served(**flags) -> dict:
        log = tmp_path / f"{len(flags)}.log"
        with llamacpp_service(log, model, free_port(), threads=1, ctx=512, **flags):
            pass
        line = next(x for x in log.read_text().splitlines() if x.startswith('{"serving"'))
        return json.loads(line)

    assert served()["llama.cpp"] == "native"
    assert served(portable=True)["llama.cpp"] == "portable"
    assert (site / "xllamacpp").is_dir()
