"""The dense embedder: the ONNX backend gives sentence-transformers' vectors, its export is made once and
survives a damaged file or concurrent workers, and the `Batcher` folds concurrent requests without
mixing up whose rows are whose."""

import json
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from dimmem.config import validate_config
from dimmem.contract.loaders import load_conversations
from dimmem.paths import REPO_ROOT
from dimmem.runtime.config import MemoryConfig
from dimmem.runtime.embed import (
    WIDTH,
    Batcher,
    Embedder,
    OnnxEmbedder,
    _fingerprint,
    default_model_path,
    make_embedder,
)


@pytest.fixture(scope="module")
def turns(locomo_path):
    conversations = load_conversations("locomo", locomo_path)
    texts = [f"{t.speaker}: {t.text}" for c in conversations for t in c.turns]
    return texts[::20]  # ~300 turns from every conversation, short and long


@pytest.fixture(scope="module")
def reference(turns):
    return Embedder().encode(turns)


def test_onnx_vectors_are_sentence_transformers_vectors(turns, reference):
    vectors = OnnxEmbedder().encode(turns)
    assert vectors.shape == reference.shape and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = (vectors * reference).sum(axis=1)
    assert cosine.min() > 0.9999, cosine.min()
    # the order of the texts and their batching change nothing
    one_by_one = np.stack([OnnxEmbedder(batch_size=1).encode([t])[0] for t in turns[:12]])
    assert np.allclose(one_by_one, vectors[:12], atol=1e-5)
    assert OnnxEmbedder().encode([]).shape == (0, WIDTH) == (0, 384)


def test_int8_vectors_stay_close(turns, reference):
    cosine = (OnnxEmbedder(precision="int8").encode(turns) * reference).sum(axis=1)
    assert cosine.mean() >= 0.99 and cosine.min() > 0.95, (cosine.mean(), cosine.min())


def test_a_model_the_onnx_backend_cannot_reproduce_is_refused(tmp_path):
    folder = tmp_path / "cls-model"
    shutil.copytree(default_model_path(), folder)
    pooling = folder / "1_Pooling" / "config.json"
    settings = json.loads(pooling.read_text()) | {
        "pooling_mode_mean_tokens": False,
        "pooling_mode_cls_token": True,
    }
    pooling.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="backend: torch"):
        OnnxEmbedder(str(folder))
    with pytest.raises(ValueError, match="backend: torch"):
        OnnxEmbedder(str(tmp_path))  # not a sentence-transformers folder at all
    with pytest.raises(ValueError, match="no such folder"):
        OnnxEmbedder(str(tmp_path / "missing"))


def test_memory_config_chooses_the_embedder():
    config = validate_config(MemoryConfig, {}, "memory config")
    assert (config.embedder.backend, config.embedder.precision) == ("onnx", "fp32")
    assert isinstance(config.build_embedder(), OnnxEmbedder)
    short = validate_config(MemoryConfig, {"embedder": default_model_path()}, "memory config")
    assert short.embedder.model == default_model_path() and short.embedder.backend == "onnx"
    torch_config = validate_config(MemoryConfig, {"embedder": {"backend": "torch"}}, "memory config")
    assert isinstance(torch_config.build_embedder(), Embedder)
    for bad, message in (
        ({"backend": "torch", "precision": "int8"}, "int8 needs backend onnx"),
        ({"backend": "tensorrt"}, "backend"),
        ({"threads": 0}, "threads"),
        ({"modle": "x"}, "modle"),
    ):
        with pytest.raises(ValueError, match=message):
            validate_config(MemoryConfig, {"embedder": bad}, "memory config")
    assert isinstance(make_embedder(backend="torch", threads=None), Embedder)


EMBED_ONE = """
import sys
from dimmem.runtime.embed import OnnxEmbedder
print(OnnxEmbedder().encode(["Caroline went to a support group."])[0][:4].tolist())
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "sentence_transformers")))
"""


def embed_in_child(cache) -> subprocess.Popen:
    env = {
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "DIMMEM_CACHE": str(cache),
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-c", EMBED_ONE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.integration
def test_workers_export_once_and_a_damaged_export_is_made_again(tmp_path, reference):
    """Two processes starting on an empty cache export under one lock and get the same vectors; once the
    export is cached a process embeds without importing torch; a damaged file is exported again."""
    cache = tmp_path / "cache"
    folder = OnnxEmbedder().folder
    stale = cache / "embedders" / f"{folder.name}-{_fingerprint(folder)}" / "model-fp32.tmp1"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half an export, killed")
    children = [embed_in_child(cache) for _ in range(2)]
    outputs = [child.communicate(timeout=600) for child in children]
    assert all(child.returncode == 0 for child in children), [err[-2000:] for _, err in outputs]
    firsts = [out.splitlines()[0] for out, _ in outputs]
    assert firsts[0] == firsts[1]
    exports = list(cache.glob("embedders/*/*"))
    assert sorted(p.name for p in exports) == [".lock", "model-fp32.onnx"], exports  # no temporary left

    out, err = embed_in_child(cache).communicate(timeout=600)
    assert out.splitlines() == [firsts[0], "[]"], err[-2000:]  # from the cache: no torch, same vector

    model = next(p for p in exports if p.name == "model-fp32.onnx")
    model.write_bytes(b"not an onnx model")
    child = embed_in_child(cache)
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0 and out.splitlines()[0] == firsts[0], err[-2000:]
    assert model.stat().st_size > 1_000_000


def test_batcher_gives_each_caller_its_own_rows_and_shares_calls_under_load():
    sizes = []

    def encode(texts):  # a slow model: row i is the text's number
        sizes.append(len(texts))
        time.sleep(0.01)
        return np.array([[float(t)] for t in texts], dtype=np.float32)

    batcher = Batcher(encode, max_texts=8)
    results, errors = {}, []

    def ask(i):
        try:
            for j in range(5):
                texts = [str(i * 100 + j * 10 + k) for k in range(1 + (i + j) % 3)]
                results[(i, j)] = (texts, batcher.encode(texts))
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for texts, vectors in results.values():
        assert vectors[:, 0].tolist() == [float(t) for t in texts]
    requests = len(results)
    assert batcher.calls == len(sizes) < requests / 2  # 12 threads at once share model calls
    assert max(sizes) <= 8
    assert Batcher(encode, max_texts=4).encode([str(k) for k in range(9)]).shape == (9, 1)  # too big: alone


def test_a_failed_batch_fails_each_of_its_callers_and_the_batcher_goes_on():
    gate, calls = threading.Event(), []

    def encode(texts):
        calls.append(list(texts))
        if len(calls) == 1:
            gate.wait(5)  # hold the first call while others queue behind it
            return np.zeros((len(texts), 1), dtype=np.float32)
        if "bad" in texts:
            raise RuntimeError("model failed")
        return np.ones((len(texts), 1), dtype=np.float32)

    batcher = Batcher(encode)
    outcomes = {}

    def ask(name, texts):
        try:
            outcomes[name] = batcher.encode(texts).tolist()
        except RuntimeError as exc:
            outcomes[name] = str(exc)

    first = threading.Thread(target=ask, args=("first", ["a"]))
    first.start()
    while not calls:
        time.sleep(0.001)
    queued = [threading.Thread(target=ask, args=(n, [t])) for n, t in (("ok", "b"), ("bad", "bad"))]
    for thread in queued:
        thread.start()
    while len(batcher._queue) < 2:  # both queued behind the held call
        time.sleep(0.001)
    gate.set()
    for thread in (first, *queued):
        thread.join()
    assert outcomes == {"first": [[0.0]], "ok": "model failed", "bad": "model failed"}
    assert sorted(calls[1]) == ["b", "bad"]  # the two that queued shared one call
    assert batcher.encode(["c"]).tolist() == [[1.0]]
