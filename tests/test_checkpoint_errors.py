"""Bad checkpoints fail with a message that names the file, tensor or field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors.torch import load_file, save_file

from trt_tei_runtime import CheckpointError, Model, UnsupportedArchitectureError, WeightError
from trt_tei_runtime.runtime import load_executor


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_checkpoint(tmp_path_factory.mktemp("good"), "BertModel", pooling="mean")


@pytest.fixture
def bad_dir(good_dir, tmp_path) -> Path:  # type: ignore[no-untyped-def]
    return Path(shutil.copytree(good_dir, tmp_path / "ckpt"))


def _edit_tensors(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _edit_config(folder: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_missing_folder():
    with pytest.raises(CheckpointError, match="model folder './nope/here' does not exist"):
        load_executor("./nope/here")


def test_missing_config(bad_dir):  # type: ignore[no-untyped-def]
    (bad_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing file config.json"):
        load_executor(bad_dir)


def test_malformed_config(bad_dir):  # type: ignore[no-untyped-def]
    (bad_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"malformed JSON in .*config\.json"):
        load_executor(bad_dir)


def test_config_field_of_wrong_type(bad_dir):  # type: ignore[no-untyped-def]
    _edit_config(bad_dir, hidden_size="big")
    with pytest.raises(CheckpointError, match="field 'hidden_size' must be an integer, got 'big'"):
        load_executor(bad_dir)


def test_unsupported_architecture_lists_supported(bad_dir):  # type: ignore[no-untyped-def]
    _edit_config(bad_dir, architectures=["T5EncoderModel"])
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_executor(bad_dir)
    message = str(err.value)
    assert "'T5EncoderModel' is not supported" in message
    assert "BertModel" in message and "XLMRobertaForSequenceClassification" in message


def test_missing_weights_file(bad_dir):  # type: ignore[no-untyped-def]
    (bad_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights in .*model.safetensors"):
        load_executor(bad_dir)


def test_missing_tensor_is_named(bad_dir):  # type: ignore[no-untyped-def]
    _edit_tensors(bad_dir, lambda t: t.pop("encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(
        WeightError, match="missing tensor 'encoder.layer.1.attention.self.key.weight'"
    ):
        load_executor(bad_dir)


def test_wrong_shape_is_named(bad_dir):  # type: ignore[no-untyped-def]
    def shrink(t):  # type: ignore[no-untyped-def]
        t["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(60, 32)

    _edit_tensors(bad_dir, shrink)
    with pytest.raises(
        WeightError,
        match=r"tensor 'encoder.layer.0.intermediate.dense.weight' .* has shape \(60, 32\), "
        r"expected \(64, 32\)",
    ):
        load_executor(bad_dir)


def test_unexpected_tensor_is_named(bad_dir):  # type: ignore[no-untyped-def]
    _edit_tensors(
        bad_dir, lambda t: t.update({"encoder.layer.2.output.dense.weight": torch.zeros(1)})
    )
    with pytest.raises(
        WeightError, match="unexpected tensors .*'encoder.layer.2.output.dense.weight'"
    ):
        load_executor(bad_dir)


def test_missing_tokenizer(bad_dir):  # type: ignore[no-untyped-def]
    (bad_dir / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="missing file tokenizer.json"):
        Model(bad_dir)


def test_malformed_pooling_config(bad_dir):  # type: ignore[no-untyped-def]
    (bad_dir / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_max_tokens": True})
    )
    with pytest.raises(CheckpointError, match=r"1_Pooling/config.json: unsupported pooling"):
        load_executor(bad_dir)


def test_hub_id_offline_fails_clearly(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError) as err:
        load_executor("some-org/not-cached-model", revision="main")
    message = str(err.value)
    assert "cannot fetch model 'some-org/not-cached-model' at revision 'main'" in message
    assert "HF_HUB_OFFLINE" in message


def test_hub_id_resolves_from_cache(monkeypatch, tmp_path, good_dir):  # type: ignore[no-untyped-def]
    """A hub id already in the cache loads offline, the way `huggingface_hub` lays it out."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub"
    repo = cache / "models--some-org--tiny-bert"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(good_dir, repo / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    model = Model("some-org/tiny-bert")
    assert model.embed(["hello"]).shape == (1, 32)


def test_sharded_checkpoint_loads(bad_dir):  # type: ignore[no-untyped-def]
    tensors = load_file(str(bad_dir / "model.safetensors"))
    (bad_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(bad_dir / file))
        weight_map.update({k: file for k in keys})
    (bad_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert Model(bad_dir).embed(["a sentence"]).shape == (1, 32)
    (bad_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match="missing weight file model-00002-of-00002.safetensors"
    ):
        load_executor(bad_dir)
