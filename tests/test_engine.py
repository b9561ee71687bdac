"""Engine builder on CPU: YAML validation, directory round trip, manifest, FP8 quality gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from checkpoints import make_checkpoint
from safetensors import safe_open

from trt_tei_runtime import Model
from trt_tei_runtime.engine import BuilderConfig, BuilderConfigError
from trt_tei_runtime.engine.build import BuildRefusedError, build_engine
from trt_tei_runtime.engine.cli import main as build_cli
from trt_tei_runtime.runtime.graphs import bucket_slots

TEXTS = ["the cat", "a dog in paris reads a book by the river", "blue"]
REPO = Path(__file__).resolve().parents[1]


def _config(checkpoint: Path, **fields) -> BuilderConfig:  # type: ignore[no-untyped-def]
    data = {
        "base_model": "encoder",
        "checkpoint_repository": {"repo": str(checkpoint), "source": "local"},
        "quantization_type": "no_quant",
        "dtype": "float32",
        "device": "cpu",
        "max_num_tokens": 4096,
        "max_batch_size": 64,
    }
    data.update(fields)
    return BuilderConfig.from_dict(data, source="test.yaml")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_checkpoint(
        tmp_path_factory.mktemp("ckpt"), "BertModel", pooling="mean", normalize=True, dense_out=16
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"base_model": "seq2seq"}, "base_model must be one of encoder, decoder; got 'seq2seq'"),
        ({"quantization_type": "int4"}, "quantization_type must be one of no_quant, fp8"),
        ({"max_num_tokens": 0}, "max_num_tokens must be a positive integer; got 0"),
        ({"max_batch_size": "many"}, "max_batch_size must be a positive integer; got 'many'"),
        ({"max_batch_size": 9000}, "max_batch_size (9000) cannot exceed max_num_tokens (4096)"),
        ({"dtype": "float8"}, "dtype must be one of float32, float16, bfloat16"),
        ({"quantization_type": "fp8"}, "fp8 needs dtype bfloat16 or float16"),
        ({"max_tokens": 1}, "unknown field(s) ['max_tokens']; allowed: base_model"),
        ({"checkpoint_repository": None}, "missing field 'checkpoint_repository'"),
        ({"checkpoint_repository": {"repo": "x", "source": "s3"}}, "source must be HF or local"),
        (
            {"checkpoint_repository": {"repo": "/no/such/dir", "source": "local"}},
            "local folder '/no/such/dir' does not exist",
        ),
        ({"checkpoint_repository": {"repo": "a/b", "branch": "x"}}, "unknown field(s) ['branch']"),
        ({"fp8_min_cosine": 1.5}, "fp8_min_cosine must be a number in (0, 1]"),
        ({"fp8_fallback": "sometimes"}, "fp8_fallback must be one of auto, none"),
    ],
)
def test_builder_yaml_validation(checkpoint, change, message):  # type: ignore[no-untyped-def]
    with pytest.raises(BuilderConfigError) as err:
        _config(checkpoint, **change)
    assert message in str(err.value)
    assert str(err.value).startswith("test.yaml")


def test_builder_yaml_files_in_release_matrix_parse():
    for path in sorted((REPO / "release_matrix_cfg").glob("*.yaml")):
        config = BuilderConfig.from_yaml(path)
        assert config.checkpoint.source == "HF", path
    with pytest.raises(BuilderConfigError, match="missing field 'base_model'"):
        BuilderConfig.from_dict({"checkpoint_repository": {"repo": "a/b"}})
    with pytest.raises(BuilderConfigError, match="does not exist"):
        BuilderConfig.from_yaml(REPO / "release_matrix_cfg" / "nope.yaml")


def test_engine_round_trip_on_cpu(checkpoint, tmp_path):  # type: ignore[no-untyped-def]
    engine_dir = tmp_path / "engine"
    manifest = build_engine(_config(checkpoint), engine_dir)
    on_disk = json.loads((engine_dir / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["architecture"] == "BertModel" and manifest["dtype"] == "float32"
    assert manifest["quantization"] == {"type": "no_quant", "quality": None}
    assert manifest["max_num_tokens"] == 4096 and manifest["pooling"] == "mean"
    for name in (
        "tokenizer.json",
        "config.json",
        "modules.json",
        "1_Pooling/config.json",
        "2_Dense/model.safetensors",
    ):
        assert (engine_dir / name).is_file(), name
    with safe_open(str(engine_dir / "engine.safetensors"), "pt") as f:
        keys = set(f.keys())
    # Fused: one QKV projection per layer, no separate query/key/value tensors.
    assert "layers.0.qkv.weight" in keys and not any("query" in k for k in keys)

    original, engine = Model(checkpoint), Model(engine_dir)
    assert engine.loaded_model.engine_manifest is not None
    np.testing.assert_array_equal(engine.embed(TEXTS), original.embed(TEXTS))
    assert engine.info.hidden_size == 16


def test_engine_refuses_mismatched_base_model_and_dtype(checkpoint, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="base_model is 'decoder' but BertModel is an encoder"):
        build_engine(_config(checkpoint, base_model="decoder"), tmp_path / "e")
    build_engine(_config(checkpoint), tmp_path / "e")
    with pytest.raises(ValueError, match="was built for float32, not bfloat16"):
        Model(tmp_path / "e", dtype="bfloat16")


def test_fp8_quality_gate(checkpoint, tmp_path):  # type: ignore[no-untyped-def]
    # A perfect-cosine demand cannot be met by FP8: refused, nothing written.
    strict = _config(checkpoint, quantization_type="fp8", dtype="bfloat16", fp8_min_cosine=1.0)
    with pytest.raises(
        BuildRefusedError,
        match="fails the quality gate: min cosine 0.9.* even with 4 of 8 linears kept in bfloat16",
    ):
        build_engine(strict, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()

    forced = build_engine(strict, tmp_path / "forced", force=True)
    assert forced["quantization"]["quality"]["passed"] is False

    ok = build_engine(
        _config(checkpoint, quantization_type="fp8", dtype="bfloat16", fp8_min_cosine=0.99),
        tmp_path / "fp8",
    )
    quality = ok["quantization"]["quality"]
    assert quality["passed"] and 0.99 <= quality["min_cosine"] < 1.0
    assert quality["quantized_linears"] == 8  # 2 layers x (qkv, attn_out, up, down)
    assert quality["kept_linears"] == []
    with safe_open(str(tmp_path / "fp8" / "engine.safetensors"), "pt") as f:
        assert str(f.get_tensor("layers.0.qkv.weight").dtype) == "torch.float8_e4m3fn"
        assert "layers.0.qkv.weight_scale" in set(f.keys())
    fp8 = Model(tmp_path / "fp8")
    reference = Model(checkpoint).embed(TEXTS)
    cos = (fp8.embed(TEXTS).astype(np.float64) * reference).sum(1)
    assert cos.min() >= 0.99


def test_fp8_fallback_keeps_the_most_sensitive_linears(checkpoint, tmp_path):  # type: ignore[no-untyped-def]
    from trt_tei_runtime.engine.calibration import CALIBRATION_TEXTS
    from trt_tei_runtime.layers.fp8 import Fp8Linear
    from trt_tei_runtime.layers.linear import Linear

    # float16: its rounding noise (10-bit mantissas) sits well below FP8's error on this
    # tiny model, so which linears stay unquantized decides the cosine; in bfloat16 both are
    # ~1e-6 and a gate between them would measure rounding order, not the fallback.
    fp8 = {"quantization_type": "fp8", "dtype": "float16"}
    plain = build_engine(
        _config(checkpoint, **fp8, fp8_fallback="none", fp8_min_cosine=1.0),
        tmp_path / "all-fp8",
        force=True,
    )["quantization"]["quality"]
    assert plain["kept_linears"] == [] and plain["quantized_linears"] == 8
    # A gate just above what FP8 everywhere gives: only the fallback can meet it.
    gate = plain["min_cosine"] + 0.05 * (1.0 - plain["min_cosine"])
    with pytest.raises(BuildRefusedError, match="fails the quality gate"):
        build_engine(
            _config(checkpoint, **fp8, fp8_fallback="none", fp8_min_cosine=gate), tmp_path / "x"
        )
    quality = build_engine(_config(checkpoint, **fp8, fp8_min_cosine=gate), tmp_path / "mixed")[
        "quantization"
    ]["quality"]
    kept = quality["kept_linears"]
    assert quality["passed"] and quality["min_cosine"] >= gate, quality
    assert 1 <= len(kept) <= 4 and quality["quantized_linears"] == 8 - len(kept)

    # The engine loads with exactly those linears in bf16, and gives the gate's figure.
    engine = Model(tmp_path / "mixed")
    network = engine.loaded_model.network
    for name, module in network.named_modules():
        if name.startswith("layers.") and isinstance(module, (Linear, Fp8Linear)):
            assert isinstance(module, Linear if name in kept else Fp8Linear), name
    reference = Model(checkpoint, dtype="float16").embed(CALIBRATION_TEXTS).astype(np.float64)
    cos = (engine.embed(CALIBRATION_TEXTS).astype(np.float64) * reference).sum(1)
    assert abs(cos.min() - quality["min_cosine"]) < 1e-6


def test_build_cli(checkpoint, tmp_path, capsys):  # type: ignore[no-untyped-def]
    config = tmp_path / "build.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "base_model": "encoder",
                "checkpoint_repository": {"repo": str(checkpoint), "source": "local"},
                "dtype": "float32",
                "device": "cpu",
            }
        )
    )
    assert build_cli([str(config), "--output", str(tmp_path / "out")]) == 0
    assert "engine written to" in capsys.readouterr().out
    config.write_text("base_model: [unclosed")
    assert build_cli([str(config), "--output", str(tmp_path / "out2")]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_graph_buckets_hold_no_more_sequence_slots_than_tokens():
    # a sequence has at least one token: a 16-token bucket holds at most 16 sequences
    assert bucket_slots(16, max_batch_size=256) == 16 + 2
    assert bucket_slots(2048, max_batch_size=256) == 256 + 2
