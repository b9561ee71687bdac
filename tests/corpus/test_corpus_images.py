"""`trt-tei-embed --image-column`: image corpora (encoded bytes in Parquet, or paths) embedded
as `Model.embed_images` embeds the same images, bad rows named, resumable after a kill (a tiny
random CLIP checkpoint, tests/checkpoints/vision.py)."""

from __future__ import annotations

import io
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoints.vision import make_vision_checkpoint, sample_images
from corpus_util import (
    json_lines,
    kill_at_first_shard,
    manifest,
    read_output,
    run_cli,
    write_corpus,
)
from PIL import Image

from trt_tei_runtime import Model
from trt_tei_runtime.corpus import CorpusError, JobOptions
from trt_tei_runtime.corpus.cli import execute, parse_options
from trt_tei_runtime.corpus.errors import BadRowError
from trt_tei_runtime.corpus.progress import Progress


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vision_checkpoint(tmp_path_factory.mktemp("clip") / "model", "CLIPModel", seed=2)


@pytest.fixture(scope="module")
def clip(clip_dir: Path) -> Model:
    return Model(str(clip_dir), device="cpu")


def make_images(n: int, seed: int = 0) -> list[bytes]:
    """`n` distinct small PNGs, then the sample images of other formats and modes."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 256, (int(rng.integers(16, 48)), 32, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
        images.append(buffer.getvalue())
    return images + sample_images()


def run(model: Model, model_dir: Path, input_path: Path, output: Path, **kw: Any):  # type: ignore[no-untyped-def]
    options = JobOptions(model=str(model_dir), input=input_path, output=output, **kw)
    return execute(options, Progress(stream=io.StringIO(), json_lines=True), model=model)


def test_encoded_images_in_parquet_equal_embed_images(clip, clip_dir, tmp_path):  # type: ignore[no-untyped-def]
    images = make_images(20)
    ids = [f"img-{i}" for i in range(len(images))]
    path = write_corpus(
        tmp_path / "images.parquet", [{"id": i, "image": b} for i, b in zip(ids, images)]
    )
    summary = run(
        clip, clip_dir, path, tmp_path / "out", image_column="image", id_column="id", shard_rows=8
    )
    assert summary.complete and summary.bad_rows == 0
    out_ids, vectors, tokens = read_output(tmp_path / "out")
    assert out_ids == ids
    np.testing.assert_allclose(vectors, clip.embed_images(images), atol=2e-5)
    np.testing.assert_array_equal(tokens, clip.info.image_input.tokens_per_image)
    m = manifest(tmp_path / "out")
    assert m["options"]["image_column"] == "image" and m["options"]["text_column"] is None
    assert len(m["shards"]) == 4


def test_paths_resolve_against_the_input_folder_or_image_root(clip, clip_dir, tmp_path):  # type: ignore[no-untyped-def]
    images = make_images(6, seed=1)
    folder = tmp_path / "pictures"
    (folder / "sub").mkdir(parents=True)
    for i, data in enumerate(images):
        (folder / "sub" / f"{i}.img").write_bytes(data)
    names = [f"sub/{i}.img" for i in range(len(images))]
    beside = write_corpus(folder / "c.jsonl", [{"path": n} for n in names])
    run(clip, clip_dir, beside, tmp_path / "beside", image_column="path")
    elsewhere = write_corpus(tmp_path / "c.csv", [{"path": n} for n in names])
    run(clip, clip_dir, elsewhere, tmp_path / "root", image_column="path", image_root=folder)
    expected = clip.embed_images(images)
    for out in ("beside", "root"):
        ids, vectors, _ = read_output(tmp_path / out)
        assert ids == list(range(len(images)))
        np.testing.assert_allclose(vectors, expected, atol=2e-5)


def test_bad_images_are_bad_rows_named_by_id(clip, clip_dir, tmp_path):  # type: ignore[no-untyped-def]
    good = make_images(3, seed=2)[:3]
    records = [
        {"id": "ok-0", "image": good[0]},
        {"id": "null", "image": None},
        {"id": "empty", "image": b""},
        {"id": "ok-1", "image": good[1]},
        {"id": "noise", "image": b"this is not an image"},
        {"id": "truncated", "image": good[2][:60]},
        {"id": "ok-2", "image": good[2]},
    ]
    path = write_corpus(tmp_path / "bad.parquet", records)
    summary = run(
        clip, clip_dir, path, tmp_path / "out", image_column="image", id_column="id",
        on_bad_row="skip",
    )  # fmt: skip
    assert summary.complete and summary.bad_rows == 4
    ids, vectors, _ = read_output(tmp_path / "out")
    assert ids == ["ok-0", "ok-1", "ok-2"]
    np.testing.assert_allclose(vectors, clip.embed_images(good), atol=2e-5)
    reasons = {b["id"]: b["reason"] for b in manifest(tmp_path / "out")["bad_rows"]["rows"]}
    assert reasons["null"] == "missing or null image" and reasons["empty"] == "empty image"
    assert "not an image" in reasons["noise"] and reasons["truncated"], reasons

    with pytest.raises(BadRowError, match=r"id 'null' \(row 1\): missing or null image"):
        run(clip, clip_dir, path, tmp_path / "fail", image_column="image", id_column="id")

    paths = write_corpus(tmp_path / "p.jsonl", [{"p": "missing.png"}])
    run(clip, clip_dir, paths, tmp_path / "paths", image_column="p", on_bad_row="skip")
    [sample] = manifest(tmp_path / "paths")["bad_rows"]["rows"]
    assert "cannot read image file" in sample["reason"] and "missing.png" in sample["reason"]


def test_mistakes_stop_the_job_before_any_row(clip, clip_dir, tiny, tiny_dir, tmp_path):  # type: ignore[no-untyped-def]
    path = write_corpus(tmp_path / "c.parquet", [{"image": make_images(1)[0], "n": 1}])
    with pytest.raises(CorpusError, match="embeds texts only"):
        run(tiny, tiny_dir, path, tmp_path / "o1", image_column="image")
    with pytest.raises(CorpusError, match="the image column must hold"):
        run(clip, clip_dir, path, tmp_path / "o2", image_column="n")
    with pytest.raises(CorpusError, match="the text column must hold strings"):
        run(clip, clip_dir, path, tmp_path / "o3", text_column="image")
    with pytest.raises(CorpusError, match="--prompt-name"):
        run(clip, clip_dir, path, tmp_path / "o4", image_column="image", prompt_name="query")
    with pytest.raises(CorpusError, match=r"no column 'photo'.*pick one with --image-column"):
        run(clip, clip_dir, path, tmp_path / "o6", image_column="photo")
    args = ["m", "--input", str(path), "--output", str(tmp_path / "o5")]
    for extra in (["--image-column", "image", "--text-column", "t"], ["--image-root", "x"]):
        with pytest.raises(SystemExit) as exited:
            parse_options([*args, *extra])
        assert exited.value.code == 2


def test_a_killed_image_job_resumes_where_it_stopped(clip, clip_dir, tmp_path):  # type: ignore[no-untyped-def]
    images = make_images(195, seed=3)
    n, shard_rows = len(images), 10
    ids = list(range(1000, 1000 + n))
    path = write_corpus(
        tmp_path / "c.parquet", [{"id": i, "image": b} for i, b in zip(ids, images)]
    )
    out = tmp_path / "out"
    args = [
        clip_dir, "--input", path, "--output", out, "--image-column", "image",
        "--id-column", "id", "--devices", "cpu", "--shard-rows", shard_rows, "--chunk-rows", 5,
    ]  # fmt: skip
    assert kill_at_first_shard(args, out) == -signal.SIGKILL
    killed = manifest(out)
    assert not killed["complete"] and len(killed["shards"]) < n // shard_rows
    kept = {s["file"]: s["sha256"] for s in killed["shards"]}

    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = json_lines(rerun.stderr)[-1]
    assert summary["complete"] and summary["resumed_rows"] == len(kept) * shard_rows
    assert {s["file"]: s["sha256"] for s in manifest(out)["shards"] if s["file"] in kept} == kept
    out_ids, vectors, _ = read_output(out)
    assert out_ids == ids  # every row exactly once
    np.testing.assert_allclose(vectors, clip.embed_images(images), atol=2e-5)
