"""`Model`: the runtime without a server, in the spirit of `SentenceTransformer.encode`."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, Union

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from .batch import PackedBatch
from .errors import CheckpointError, InputError
from .images import DEFAULT_MAX_IMAGE_PIXELS, ImageSource
from .late_interaction import LateInteraction, check_input_type
from .long_inputs import (
    DEFAULT_MAX_CHUNKS,
    Windows,
    check_chunking,
    long_input_mode,
    mean_of_windows,
)
from .pooling import apply_score_activation, finish_embeddings
from .runtime import Executor, LoadedModel, ModelInfo, load_executors, parse_device
from .runtime.devices import DeviceSpec
from .runtime.dispatch import Job, Method, run_jobs
from .runtime.stream import Chunk, cat_rows, run_chunks
from .sparse import unpack_active
from .token_ids import TokenIds
from .tokenization import TextOrPair, TextTokenizer

DEFAULT_MAX_BATCH_TOKENS = 16384
# Inputs tokenized at a time, ahead of the devices: enough for several full batches, few
# enough that the first batch starts soon.
TOKENIZE_CHUNK = 256
# Fewer inputs than this show no progress bar unless asked.
PROGRESS_MIN_INPUTS = 256
# Threads decoding and resizing images ahead of the devices (Pillow releases the
# interpreter lock while it does).
IMAGE_THREADS = min(8, os.cpu_count() or 1)

K = TypeVar("K")
# Token ids of several inputs: lists, or the flat arrays `tokenize_ids` returns.
Ids = Union[Sequence[Sequence[int]], TokenIds]


class Model:
    """An embedding, reranking or classification model loaded from a checkpoint folder or hub id.

    >>> model = Model("sentence-transformers/all-MiniLM-L6-v2")
    >>> model.embed(["a query", "a document"]).shape
    (2, 384)

    Text-and-image models (CLIP, SigLIP) also embed images, in the space of their texts:
    `Model("openai/clip-vit-base-patch32").embed_images(["cat.jpg", png_bytes, pil_image])`.

    `device`: one device (default: the first GPU, else the CPU), or several, which then
    share every call's batches: `"all"` (every visible GPU), `"cuda:0,cuda:1"` or a list.
    Texts are tokenized on a thread of their own, ahead of the devices.

    `lora_adapters`: name -> PEFT LoRA folder, loaded onto the base weights; each call
    picks one by name (`embed(texts, adapter="name")`), the base weights without one.
    Calls for different adapters may run at once and share batches.
    """

    def __init__(
        self,
        model_id_or_path: str | os.PathLike[str],
        device: DeviceSpec = None,
        dtype: str | torch.dtype | None = None,
        pooling: str | None = None,
        *,
        revision: str | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        task: str | None = None,
        cuda_graphs: bool | None = None,
        max_active_dims: int | None = None,
        lora_adapters: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> None:
        if max_batch_tokens <= 0:
            raise InputError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.executors: list[Executor] = load_executors(
            model_id_or_path,
            devices=[parse_device(None)] if device is None else device,
            revision=revision,
            dtype=dtype,
            pooling=pooling,
            task=task,
            cuda_graphs=cuda_graphs,
            max_active_dims=max_active_dims,
            lora_adapters=lora_adapters,
            max_num_tokens=max_batch_tokens,
            # No queries arrive between a Model's batches: nothing to keep a lane free for.
            interactive_lane=False,
        )
        self.info: ModelInfo = self.executors[0].info
        self._tokenizer: TextTokenizer | None = None
        # An image model may come without a tokenizer.json (SigLIP's sentencepiece one has
        # no fast form): it still embeds images, and says so when asked for texts.
        if self.info.image_input is None or (self.info.model_dir / "tokenizer.json").is_file():
            self._tokenizer = TextTokenizer(
                self.info.model_dir,
                self.info.max_input_length,
                prompts=self.info.prompts,
                default_prompt_name=self.info.default_prompt_name,
                pair_template=self.info.pair_template,
                adapters=self.info.adapters,
                padding=self.info.text_padding,
            )
        # ColBERT: a tokenizer per input type, each cut to that type's length.
        self._late_tokenizers: dict[str, TextTokenizer] = {}
        # A batch must hold at least one sequence of the maximum length.
        self.max_batch_tokens = max(max_batch_tokens, self.info.max_input_length)
        self._tokens: Counter[str] = Counter()
        self._tokens_lock = threading.Lock()

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            raise CheckpointError(
                f"{self.info.model_dir} has no tokenizer.json: this model embeds images only "
                "(save its tokenizer as a fast one, e.g. transformers' "
                "AutoTokenizer(...).save_pretrained, to embed texts)"
            )
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        """The first device (the only one unless several were asked for)."""
        return self.executors[0].device

    @property
    def devices(self) -> list[torch.device]:
        return [executor.device for executor in self.executors]

    @property
    def dtype(self) -> torch.dtype:
        return self.executors[0].dtype

    @property
    def loaded_model(self) -> LoadedModel:
        """The network and its weights, for build-time tools that convert it in place
        (FP8); a model on one device only."""
        if len(self.executors) != 1:
            raise InputError("loaded_model needs a model on one device")
        return self.executors[0].model

    def tokens_per_device(self) -> dict[str, int]:
        """Tokens run on each device since the model was loaded."""
        with self._tokens_lock:
            return dict(self._tokens)

    def embed(
        self,
        texts: str | Sequence[str],
        normalize: bool = True,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        truncate: bool = True,
        show_progress_bar: bool | None = None,
        adapter: str | None = None,
        long_input: str | None = None,
        chunk_overlap: int = 0,
        max_chunks: int = DEFAULT_MAX_CHUNKS,
    ) -> np.ndarray:
        """Embeddings `(n, dim)` float32; `dimensions` truncates (Matryoshka) before normalizing.
        `adapter`: the name of a LoRA adapter to embed with (see `Model`); it takes the
        place of the adapter a prompt name would pick (jina-embeddings-v3's tasks).
        `long_input` (default: `truncate`'s choice): what a text over the model's limit gets,
        `"error"`, `"truncate"` or `"chunk"` (embedded whole: the weighted mean of windows
        overlapping by `chunk_overlap` tokens, at most `max_chunks` of them, as the server's
        `long_input: chunk`)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_dimensions(dimensions)
        self._check_strings(texts)
        prompt_name = prompt_name or None
        self.tokenizer.encode_ids([], prompt_name)  # checks the prompt name
        index = self.adapter_index(adapter)
        mode = long_input_mode(long_input, truncate)
        if mode == "chunk":
            check_chunking(chunk_overlap, max_chunks)
            windows = [
                self.tokenizer.encode_windows(
                    texts[start : start + TOKENIZE_CHUNK],
                    prompt_name,
                    overlap=chunk_overlap,
                    max_chunks=max_chunks,
                    first=start,
                )
                for start in range(0, len(texts), TOKENIZE_CHUNK)
            ]
            rows = self._run(
                sum(w.weights.size for w in windows),
                self._window_chunks(windows, index),
                show_progress_bar,
                Executor.embed,
            )
            if rows is None:
                return self._finish(None, normalize, dimensions)
            counts = np.concatenate([w.counts for w in windows])
            weights = np.concatenate([w.weights for w in windows])
            return self._finish(mean_of_windows(rows, counts, weights), normalize, dimensions)
        truncate = mode == "truncate"

        def chunks() -> Iterator[Chunk[int]]:
            for start in range(0, len(texts), TOKENIZE_CHUNK):
                part = texts[start : start + TOKENIZE_CHUNK]
                # Models with per-request adapters read the adapter from the token type ids.
                ids, types = self.tokenizer.encode_ids(part, prompt_name, truncate=truncate)
                yield Chunk(start, ids, self._adapter_types(ids, types, index), first=start)

        outputs = self._run(len(texts), chunks(), show_progress_bar, Executor.embed)
        return self._finish(outputs, normalize, dimensions)

    def embed_images(
        self,
        images: ImageSource | Sequence[ImageSource],
        normalize: bool = True,
        dimensions: int | None = None,
        show_progress_bar: bool | None = None,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> np.ndarray:
        """Image embeddings `(n, dim)` float32 of a text-and-image model (CLIP, SigLIP), in
        the space of `embed`'s: each image a PIL image, a path, or the bytes of a PNG, JPEG,
        WebP or GIF (its first frame), preprocessed as the checkpoint's
        `preprocessor_config.json` says (`images.py`). An image that cannot be read or has
        more than `max_image_pixels` pixels (None: no limit) is an `InputError` naming its
        index. Images are decoded on a few threads while the devices run earlier batches."""
        image_input = self.info.image_input
        if image_input is None:
            raise InputError(
                f"{self.info.architecture} embeds texts only: it takes no images "
                "(image models: CLIPModel, SiglipModel, Siglip2Model)"
            )
        items = _as_images(images)
        self._check_dimensions(dimensions)
        if not items:
            return np.zeros((0, dimensions or self.info.hidden_size), dtype=np.float32)
        per_batch = self.executors[0].max_images(self.max_batch_tokens)
        preprocessor = image_input.preprocessor
        pin = any(executor.device.type == "cuda" for executor in self.executors)

        def prepare(index: int) -> np.ndarray:
            try:
                return preprocessor.preprocess(items[index], max_image_pixels)
            except InputError as exc:
                raise InputError(f"image {index}: {exc}") from None

        def jobs(pool: ThreadPoolExecutor) -> Iterator[Job[torch.Tensor]]:
            for start in range(0, len(items), per_batch):
                rows = range(start, min(start + per_batch, len(items)))
                pixels = torch.from_numpy(np.stack(list(pool.map(prepare, rows))))
                yield Job(start, pixels.pin_memory() if pin else pixels)

        outputs: dict[int, torch.Tensor] = {}
        progress = self._progress(len(items), show_progress_bar)
        with progress, ThreadPoolExecutor(IMAGE_THREADS, "image-decode") as pool:
            for job, out, device in run_jobs(self.executors, jobs(pool), _embed_images):
                outputs[job.key] = out
                self._count_tokens(0, device, out.shape[0] * image_input.tokens_per_image)
                progress.update(out.shape[0])
        pooled = torch.cat([outputs[start] for start in sorted(outputs)])
        return self._finish(pooled, normalize, dimensions)

    def embed_sparse(
        self,
        texts: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        truncate: bool = True,
        max_active_dims: int | None = None,
        sparse_tensor: bool = False,
        show_progress_bar: bool | None = None,
        adapter: str | None = None,
    ) -> list[dict[int, float]] | torch.Tensor:
        """A SPLADE model's sparse vectors, one per text: `{vocabulary index: value}` of the
        active dimensions in index order, or with `sparse_tensor=True` one float32
        `torch.sparse_coo_tensor` of shape `(n, vocab_size)` (what sentence-transformers'
        `SparseEncoder.encode` returns). `max_active_dims` keeps the largest values only
        (default: the model's, from `Model(..., max_active_dims=)`)."""
        if self.info.splade is None:
            raise InputError(
                f"{self.info.architecture} is not a SPLADE model: embed_sparse needs a "
                "masked-LM checkpoint (BertForMaskedLM) with SpladePooling"
            )
        if max_active_dims is not None and max_active_dims <= 0:
            raise InputError(f"max_active_dims must be a positive integer, got {max_active_dims}")
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_strings(texts)
        prompt_name = prompt_name or None
        self.tokenizer.encode_ids([], prompt_name)  # checks the prompt name
        index = self.adapter_index(adapter)

        def chunks() -> Iterator[Chunk[int]]:
            for start in range(0, len(texts), TOKENIZE_CHUNK):
                part = texts[start : start + TOKENIZE_CHUNK]
                ids, _ = self.tokenizer.encode_ids(part, prompt_name, truncate=truncate)
                yield Chunk(start, ids, self._adapter_types(ids, None, index), first=start)

        def method(executor: Executor, batch: PackedBatch) -> torch.Tensor:
            return executor.embed_sparse(batch, max_active_dims=max_active_dims)

        packed = self._run(len(texts), chunks(), show_progress_bar, method)
        rows = [] if packed is None else [unpack_active(row) for row in packed]
        if not sparse_tensor:
            return rows
        return _sparse_tensor(rows, self.info.hidden_size)

    def embed_multivector(
        self,
        texts: str | Sequence[str],
        input_type: str,
        show_progress_bar: bool | None = None,
    ) -> list[np.ndarray]:
        """A late-interaction (ColBERT) model's token vectors: per text a float32
        `(tokens, dim)` array of L2-normalized rows, as PyLate's `ColBERT.encode` gives them
        (`late_interaction.py`): `input_type="query"` with its prefix and mask-token
        expansion, `"document"` with its prefix and without the skiplist's tokens. Inputs
        are cut to the model's query or document length."""
        late = self._late_interaction("embed_multivector")
        input_type = check_input_type(input_type)
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_strings(texts)
        inputs: dict[int, TokenIds] = {}

        def chunks() -> Iterator[Chunk[int]]:
            for chunk in self._late_chunks(late, texts, input_type):
                inputs[chunk.key] = chunk.ids
                yield chunk

        vectors: list[np.ndarray] = []
        progress = self._progress(len(texts), show_progress_bar)

        def on_batch(rows: int, device: torch.device, tokens: int) -> None:
            self._count_tokens(rows, device, tokens)
            progress.update(rows)

        with progress:
            for start, rows in run_chunks(
                self.executors,
                chunks(),
                Executor.embed_multivector,
                self.max_batch_tokens,
                self.info.position_offset,
                on_batch,
            ):
                ids = inputs.pop(start)
                assert rows is not None
                table = rows.numpy()
                for i in range(len(ids)):
                    kept = late.kept_tokens(ids[i], input_type)
                    vectors.append(table[i, : kept.size][kept])
        return vectors

    def _late_interaction(self, what: str) -> LateInteraction:
        late = self.info.late_interaction
        if late is None:
            raise InputError(
                f"{what} needs a late-interaction (ColBERT) model; {self.info.architecture} "
                f"is a {self.info.model_type} model"
            )
        return late

    def _late_chunks(
        self, late: LateInteraction, texts: list[str], input_type: str
    ) -> Iterator[Chunk[int]]:
        """`texts` as the model reads them (`LateInteraction.model_inputs`), a chunk at a
        time under the index of its first text."""
        tokenizer = self._late_tokenizer(late, input_type)
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            # sentence-transformers strips every text before tokenizing it.
            part = [text.strip() for text in texts[start : start + TOKENIZE_CHUNK]]
            ids, _ = tokenizer.encode_ids(part, truncate=True)
            yield Chunk(start, late.model_inputs(ids, input_type), first=start)

    def _late_tokenizer(self, late: LateInteraction, input_type: str) -> TextTokenizer:
        tokenizer = self._late_tokenizers.get(input_type)
        if tokenizer is None:
            tokenizer = TextTokenizer(self.info.model_dir, late.token_limit(input_type))
            self._late_tokenizers[input_type] = tokenizer
        return tokenizer

    def tokenize(
        self,
        texts: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        truncate: bool = True,
    ) -> list[list[int]]:
        """Token ids of each text as `embed` feeds them to the model (prompt and special
        tokens included, truncated to the model's limit unless `truncate=False`)."""
        return self.tokenize_ids(texts, prompt_name=prompt_name, truncate=truncate).to_lists()

    def tokenize_ids(
        self,
        texts: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        truncate: bool = True,
    ) -> TokenIds:
        """`tokenize` as flat arrays (`TokenIds`: every id end to end, and offsets), which
        `embed_ids` and `embed_ids_stream` take without a per-token Python object."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_strings(texts)
        ids, _ = self.tokenizer.encode_ids(texts, prompt_name or None, truncate=truncate)
        return ids

    def tokenize_windows(
        self,
        texts: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        overlap: int = 0,
        max_chunks: int = DEFAULT_MAX_CHUNKS,
    ) -> Windows:
        """Texts cut into windows as `embed(long_input="chunk")` cuts them (a text within the
        limit is one window): the windows' ids end to end, each text's window count and each
        window's weight. `embed_ids(windows.ids, normalize=False)` and `mean_of_windows`
        then give what `embed` would."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_strings(texts)
        check_chunking(overlap, max_chunks)
        return self.tokenizer.encode_windows(
            texts, prompt_name or None, overlap=overlap, max_chunks=max_chunks
        )

    def embed_ids(
        self,
        ids: Ids,
        normalize: bool = True,
        dimensions: int | None = None,
        show_progress_bar: bool | None = None,
        adapter: str | None = None,
    ) -> np.ndarray:
        """`embed` on token ids from `tokenize`/`tokenize_ids` (or any tokenizer of the
        model's vocabulary): `(n, dim)` float32. Every sequence needs at least one token.
        `adapter`: a LoRA adapter's name, as in `embed`."""
        self._check_dimensions(dimensions)
        tokens = _token_ids(ids)
        types = self._adapter_types(tokens, None, self.adapter_index(adapter))
        outputs = self._run(
            len(tokens), iter([Chunk(0, tokens, types)]), show_progress_bar, Executor.embed
        )
        return self._finish(outputs, normalize, dimensions)

    def embed_ids_stream(
        self,
        chunks: Iterable[tuple[K, Ids]],
        normalize: bool = True,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        adapter: str | None = None,
    ) -> Iterator[tuple[K, np.ndarray]]:
        """`embed_ids` over a stream of `(key, ids)` chunks: yields `(key, (n, dim) float32)`
        per chunk, in order, as soon as the chunk is done, while later chunks already run.
        The devices do not drain between chunks as they do between `embed_ids` calls; the
        chunks iterator is read on a thread of its own. A chunk of no ids passes through
        (as an empty array) in its place: a marker for the caller.

        `prompt_name`: the prompt the ids were tokenized with (`tokenize_ids`); it picks
        the task adapter of models that have them (jina-embeddings-v3), else changes nothing.
        `adapter`: a LoRA adapter's name, as in `embed` (it takes the prompt's place)."""
        self._check_dimensions(dimensions)
        dim = dimensions or self.info.hidden_size
        index = self.adapter_index(adapter)
        if index is None:
            type_id = self.tokenizer.adapter(prompt_name or None)
        else:
            type_id = index * self.info.adapter_type_stride
        stream = (_with_adapter(key, _token_ids(ids), type_id) for key, ids in chunks)
        for key, out in run_chunks(
            self.executors,
            stream,
            Executor.embed,
            self.max_batch_tokens,
            self.info.position_offset,
            self._count_tokens,
        ):
            if out is None:
                yield key, np.zeros((0, dim), dtype=np.float32)
            else:
                vectors = finish_embeddings(out, normalize=normalize, dimensions=dimensions)
                yield key, vectors.numpy()

    def adapter_index(self, adapter: str | None) -> int | None:
        """The 1-based index of the LoRA adapter named `adapter` (`info.lora_adapters`);
        None for None. An unknown name is an `InputError` naming the loaded ones."""
        if adapter is None:
            return None
        index = self.info.lora_adapters.get(adapter)
        if index is None:
            loaded = ", ".join(repr(n) for n in self.info.lora_adapters) or "none"
            raise InputError(f"unknown adapter {adapter!r}; loaded adapters: {loaded}")
        return index

    def _adapter_types(
        self, ids: TokenIds, types: TokenIds | None, index: int | None
    ) -> TokenIds | None:
        """Type ids carrying adapter `index` (`ModelInfo.lora_adapters`): each token's own
        type (all 0 when `types` is None) plus `index` times the stride. `types` as they are
        for `index` None."""
        if index is None:
            return types
        stride = self.info.adapter_type_stride
        offset = np.uint32(index * stride)
        if types is None:
            return TokenIds(np.full(ids.num_tokens, offset, np.uint32), ids.offsets)
        # The real type's range: a model that reads no types (stride 1) gets type 0.
        return TokenIds(types.ids % np.uint32(stride) + offset, types.offsets)

    def _window_chunks(self, windows: list[Windows], index: int | None) -> Iterator[Chunk[int]]:
        """Every window as an input of its own, in order."""
        row = 0
        for part in windows:
            types = self._adapter_types(part.ids, part.type_ids, index)
            yield Chunk(row, part.ids, types, first=row)
            row += part.weights.size

    def _check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and not 0 < dimensions <= self.info.hidden_size:
            raise InputError(
                f"dimensions must be between 1 and {self.info.hidden_size}, got {dimensions}"
            )

    @staticmethod
    def _check_strings(texts: Sequence[object]) -> None:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"input {i} must be a string, got {type(text).__name__}")

    def _finish(
        self, outputs: torch.Tensor | None, normalize: bool, dimensions: int | None
    ) -> np.ndarray:
        if outputs is None:
            return np.zeros((0, dimensions or self.info.hidden_size), dtype=np.float32)
        return finish_embeddings(outputs, normalize=normalize, dimensions=dimensions).numpy()

    def predict(
        self,
        texts_or_pairs: TextOrPair | Sequence[TextOrPair],
        raw_scores: bool = False,
        truncate: bool = True,
        show_progress_bar: bool | None = None,
        adapter: str | None = None,
    ) -> np.ndarray:
        """Scores `(n, num_labels)`: sigmoid/softmax as TEI applies them, or raw logits.

        For a model with a pair template (yes/no rerankers), each (query, document) pair is
        formatted with it; a single string is scored as given (already formatted).
        `adapter`: a LoRA adapter's name, as in `embed`."""
        items = _as_items(texts_or_pairs)
        index = self.adapter_index(adapter)
        logits = self._run(
            len(items),
            self._pair_chunks(items, truncate, index),
            show_progress_bar,
            Executor.predict,
        )
        if logits is None:
            return np.zeros((0, self.info.num_labels), dtype=np.float32)
        if not raw_scores:
            logits = apply_score_activation(logits, self.info.score_activation)
        return logits.numpy()

    def rerank(
        self,
        query: str,
        texts: Sequence[str],
        raw_scores: bool = False,
        truncate: bool = True,
        top_n: int | None = None,
        adapter: str | None = None,
    ) -> list[tuple[int, float]]:
        """(index into `texts`, score) pairs, best first; `adapter` as in `predict`.
        A late-interaction (ColBERT) model scores by MaxSim between the query's and each
        text's vectors (`embed_multivector`), on the model's device; `raw_scores`,
        `truncate` and `adapter` do not apply to it."""
        if self.info.late_interaction is not None:
            late_scores = self.maxsim_scores(query, texts)
            order = sorted(range(len(texts)), key=lambda i: -float(late_scores[i]))
            return [(i, float(late_scores[i])) for i in order[:top_n]]
        if self.info.model_type != "reranker":
            raise InputError(
                f"rerank needs a single-label reranker; this model is a {self.info.model_type}"
            )
        pairs = [(query, t) for t in texts]
        scores = self.predict(pairs, raw_scores=raw_scores, truncate=truncate, adapter=adapter)
        order = sorted(range(len(texts)), key=lambda i: -float(scores[i, 0]))
        return [(i, float(scores[i, 0])) for i in order[:top_n]]

    def maxsim_scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """A late-interaction model's MaxSim score of `query` against each text, float32
        `(n,)` in input order. The documents are scored where they run
        (`Executor.maxsim`): their token vectors never leave the device."""
        late = self._late_interaction("rerank")
        texts = list(texts)
        self._check_strings(texts)
        query_rows = torch.from_numpy(self.embed_multivector([query], "query")[0])
        on_device = {executor.device: query_rows.to(executor.device) for executor in self.executors}

        def score(executor: Executor, batch: PackedBatch) -> torch.Tensor:
            spans = torch.tensor([[0, query_rows.shape[0]]] * batch.num_seqs, dtype=torch.int64)
            return executor.maxsim(batch, on_device[executor.device], spans)

        scores = np.zeros(len(texts), dtype=np.float32)
        for start, rows in run_chunks(
            self.executors,
            self._late_chunks(late, texts, "document"),
            score,
            self.max_batch_tokens,
            self.info.position_offset,
            lambda rows, device, tokens: self._count_tokens(rows, device, tokens),
        ):
            assert rows is not None
            scores[start : start + rows.shape[0]] = rows[:, 0].numpy()
        return scores

    def _pair_chunks(
        self, items: list[TextOrPair], truncate: bool, adapter: int | None = None
    ) -> Iterator[Chunk[int]]:
        """Tokenized texts or pairs (a pair with the model's pair template, if it has one),
        a chunk at a time."""
        for start in range(0, len(items), TOKENIZE_CHUNK):
            part = items[start : start + TOKENIZE_CHUNK]
            ids, type_ids = self.tokenizer.encode_flat(part, truncate=truncate, first=start)
            yield Chunk(start, ids, self._adapter_types(ids, type_ids, adapter), first=start)

    def _count_tokens(self, rows: int, device: torch.device, tokens: int) -> None:
        with self._tokens_lock:
            self._tokens[str(device)] += tokens

    @staticmethod
    def _progress(count: int, show_progress_bar: bool | None) -> tqdm:
        # tqdm's None: shown on a terminal only.
        if show_progress_bar is None:
            disable = True if count < PROGRESS_MIN_INPUTS else None
        else:
            disable = not show_progress_bar
        return tqdm(total=count, disable=disable, unit="input")

    def _run(
        self,
        count: int,
        chunks: Iterator[Chunk[int]],
        show_progress_bar: bool | None,
        method: Method,
    ) -> torch.Tensor | None:
        """Runs every chunk's inputs in token-budget batches (longest first within a chunk)
        on whichever device is free, while the next chunk is tokenized; returns the rows
        in input order."""
        if count == 0:
            return None
        progress = self._progress(count, show_progress_bar)

        def on_batch(rows: int, device: torch.device, tokens: int) -> None:
            self._count_tokens(rows, device, tokens)
            progress.update(rows)

        outputs: list[torch.Tensor] = []
        with progress:
            for _, out in run_chunks(
                self.executors,
                chunks,
                method,
                self.max_batch_tokens,
                self.info.position_offset,
                on_batch,
            ):
                if out is not None:
                    outputs.append(out)
        return cat_rows(outputs)


def _embed_images(executor: Executor, pixels: torch.Tensor) -> torch.Tensor:
    return executor.embed_images(pixels)


def _as_images(images: ImageSource | Sequence[ImageSource]) -> list[ImageSource]:
    """One image (bytes, a path, a PIL image) or a list of them."""
    if isinstance(images, (bytes, bytearray, memoryview, str, os.PathLike, Image.Image)):
        return [images]
    return list(images)


def _as_items(texts_or_pairs: TextOrPair | Sequence[TextOrPair]) -> list[TextOrPair]:
    """A string or a tuple of two strings is one input; a list holds several."""
    if isinstance(texts_or_pairs, str):
        return [texts_or_pairs]
    if (
        isinstance(texts_or_pairs, tuple)
        and len(texts_or_pairs) == 2
        and all(isinstance(x, str) for x in texts_or_pairs)
    ):
        return [(texts_or_pairs[0], texts_or_pairs[1])]  # type: ignore[list-item]
    return list(texts_or_pairs)


def _token_ids(ids: Ids) -> TokenIds:
    return ids if isinstance(ids, TokenIds) else TokenIds.from_lists(ids)


def _with_adapter(key: K, ids: TokenIds, adapter: int) -> Chunk[K]:
    """A chunk whose every token carries `adapter` as its type id (0: none), an adapter
    index times `ModelInfo.adapter_type_stride`."""
    if not adapter:
        return Chunk(key, ids)
    return Chunk(key, ids, TokenIds(np.full(ids.num_tokens, adapter, np.uint32), ids.offsets))


def _sparse_tensor(rows: list[dict[int, float]], vocab_size: int) -> torch.Tensor:
    row_ids = [i for i, row in enumerate(rows) for _ in row]
    col_ids = [j for row in rows for j in row]
    values = [v for row in rows for v in row.values()]
    # Checked (cheap at this size): torch warns on every sparse tensor built unchecked.
    with torch.sparse.check_sparse_tensor_invariants(enable=True):
        return torch.sparse_coo_tensor(
            torch.tensor([row_ids, col_ids], dtype=torch.int64).reshape(2, -1),
            torch.tensor(values, dtype=torch.float32),
            (len(rows), vocab_size),
        ).coalesce()
