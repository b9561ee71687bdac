"""`Model`: the runtime without a server, in the spirit of `SentenceTransformer.encode`."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from .batch import PackedBatch, token_budget_batches
from .errors import InputError
from .pooling import apply_score_activation, finish_embeddings
from .runtime import Executor, LoadedModel, ModelInfo, load_executors, parse_device
from .runtime.devices import DeviceSpec
from .runtime.dispatch import Job, Method, run_jobs
from .tokenization import TextOrPair, TextTokenizer

DEFAULT_MAX_BATCH_TOKENS = 16384
# Inputs tokenized at a time, ahead of the devices: enough for several full batches, few
# enough that the first batch starts soon.
TOKENIZE_CHUNK = 256
# Fewer inputs than this show no progress bar unless asked.
PROGRESS_MIN_INPUTS = 256

# (offset of the chunk's first input, token ids, token type ids or None for all zeros).
Chunk = tuple[int, list[list[int]], Optional[list[list[int]]]]


class Model:
    """An embedding, reranking or classification model loaded from a checkpoint folder or hub id.

    >>> model = Model("sentence-transformers/all-MiniLM-L6-v2")
    >>> model.embed(["a query", "a document"]).shape
    (2, 384)

    `device`: one device (default: the first GPU, else the CPU), or several, which then
    share every call's batches: `"all"` (every visible GPU), `"cuda:0,cuda:1"` or a list.
    Texts are tokenized on a thread of their own, ahead of the devices.
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
            max_num_tokens=max_batch_tokens,
            # No queries arrive between a Model's batches: nothing to keep a lane free for.
            interactive_lane=False,
        )
        self.info: ModelInfo = self.executors[0].info
        self.tokenizer = TextTokenizer(self.info.model_dir, self.info.max_input_length)
        # A batch must hold at least one sequence of the maximum length.
        self.max_batch_tokens = max(max_batch_tokens, self.info.max_input_length)
        self._tokens: Counter[str] = Counter()
        self._tokens_lock = threading.Lock()

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
    ) -> np.ndarray:
        """Embeddings `(n, dim)` float32; `dimensions` truncates (Matryoshka) before normalizing."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_dimensions(dimensions)
        self._check_strings(texts)
        prompt = self._prompt(prompt_name)

        def chunks() -> Iterator[Chunk]:
            for start in range(0, len(texts), TOKENIZE_CHUNK):
                part = texts[start : start + TOKENIZE_CHUNK]
                yield start, self._encode(part, prompt, truncate), None

        outputs = self._run(len(texts), chunks(), show_progress_bar, Executor.embed)
        return self._finish(outputs, normalize, dimensions)

    def tokenize(
        self,
        texts: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        truncate: bool = True,
    ) -> list[list[int]]:
        """Token ids of each text as `embed` feeds them to the model (prompt and special
        tokens included, truncated to the model's limit unless `truncate=False`)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self._check_strings(texts)
        return self._encode(texts, self._prompt(prompt_name), truncate)

    def _encode(self, texts: list[str], prompt: str, truncate: bool) -> list[list[int]]:
        return [
            e.ids for e in self.tokenizer.encode([prompt + t for t in texts], truncate=truncate)
        ]

    def embed_ids(
        self,
        ids: Sequence[Sequence[int]],
        normalize: bool = True,
        dimensions: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """`embed` on token ids from `tokenize` (or any tokenizer of the model's vocabulary):
        `(n, dim)` float32. Every sequence needs at least one token."""
        self._check_dimensions(dimensions)
        rows = [list(seq) for seq in ids]
        chunk: Chunk = (0, rows, None)
        outputs = self._run(len(rows), iter([chunk]), show_progress_bar, Executor.embed)
        return self._finish(outputs, normalize, dimensions)

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
    ) -> np.ndarray:
        """Scores `(n, num_labels)`: sigmoid/softmax as TEI applies them, or raw logits.

        For a model with a pair template (yes/no rerankers), each (query, document) pair is
        formatted with it; a single string is scored as given (already formatted)."""
        items = _as_items(texts_or_pairs)
        suffixes = None
        template = self.info.pair_template
        if template is not None:
            suffixes = [template.suffix_ids if _is_pair(it) else () for it in items]
            items = [template.head(*it) if _is_pair(it) else it for it in items]  # type: ignore[misc]
        logits = self._run(
            len(items),
            self._pair_chunks(items, truncate, suffixes),
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
    ) -> list[tuple[int, float]]:
        """(index into `texts`, score) pairs, best first."""
        if self.info.model_type != "reranker":
            raise InputError(
                f"rerank needs a single-label reranker; this model is a {self.info.model_type}"
            )
        scores = self.predict([(query, t) for t in texts], raw_scores=raw_scores, truncate=truncate)
        order = sorted(range(len(texts)), key=lambda i: -float(scores[i, 0]))
        return [(i, float(scores[i, 0])) for i in order[:top_n]]

    def _prompt(self, prompt_name: str | None) -> str:
        name = prompt_name or self.info.default_prompt_name
        if name is None:
            return ""
        if name not in self.info.prompts:
            raise InputError(
                f"unknown prompt_name {name!r}; the model has {sorted(self.info.prompts) or 'none'}"
            )
        return self.info.prompts[name]

    def _pair_chunks(
        self,
        items: list[TextOrPair],
        truncate: bool,
        suffixes: list[tuple[int, ...]] | None,
    ) -> Iterator[Chunk]:
        """Tokenized texts or pairs, a chunk at a time; `suffixes[i]` (token ids) is
        appended to item i after truncation, which keeps it."""
        for start in range(0, len(items), TOKENIZE_CHUNK):
            encodings = self.tokenizer.encode(
                items[start : start + TOKENIZE_CHUNK], truncate=truncate
            )
            ids = [e.ids for e in encodings]
            type_ids = [e.type_ids for e in encodings]
            for i, suffix in enumerate((suffixes or [])[start : start + len(ids)]):
                if suffix:
                    ids[i] = self._with_suffix(ids[i], suffix, truncate, start + i)
                    type_ids[i] = [0] * len(ids[i])
            yield start, ids, type_ids

    def _run(
        self, count: int, chunks: Iterator[Chunk], show_progress_bar: bool | None, method: Method
    ) -> torch.Tensor | None:
        """Runs every chunk's inputs in token-budget batches (longest first within a chunk)
        on whichever device is free, while the next chunk is tokenized; returns the rows
        in input order."""
        if count == 0:
            return None

        # Pinned here, on the packing thread, not by the thread that launches the batch.
        pin = any(executor.device.type == "cuda" for executor in self.executors)

        def jobs() -> Iterator[Job]:
            for start, ids, type_ids in chunks:
                lengths = [len(seq) for seq in ids]
                for i, n in enumerate(lengths):
                    if n == 0:
                        raise InputError(f"input {start + i} is empty after tokenization")
                for batch in token_budget_batches(lengths, self.max_batch_tokens):
                    packed = PackedBatch.from_sequences(
                        [ids[i] for i in batch],
                        None if type_ids is None else [type_ids[i] for i in batch],
                        self.info.position_offset,
                    )
                    yield Job([start + i for i in batch], packed.pin_memory() if pin else packed)

        # tqdm's None: shown on a terminal only.
        if show_progress_bar is None:
            disable = True if count < PROGRESS_MIN_INPUTS else None
        else:
            disable = not show_progress_bar
        progress = tqdm(total=count, disable=disable, unit="input")
        rows: list[list[int]] = []
        outputs: list[torch.Tensor] = []
        tokens: Counter[str] = Counter()
        with progress:
            for job, out, device in run_jobs(self.executors, jobs(), method):
                # Put in order once at the end: this thread competes for the interpreter
                # with the threads that pack and launch batches.
                rows.append(job.key)
                outputs.append(out)
                tokens[str(device)] += job.batch.num_tokens
                progress.update(len(job.key))
        with self._tokens_lock:
            self._tokens.update(tokens)
        stacked = torch.cat(outputs)
        results = torch.empty_like(stacked)
        results[torch.tensor([i for key in rows for i in key])] = stacked
        return results

    def _with_suffix(
        self, ids: list[int], suffix: tuple[int, ...], truncate: bool, index: int
    ) -> list[int]:
        limit = self.info.max_input_length
        if len(ids) + len(suffix) <= limit:
            return ids + list(suffix)
        if not truncate:
            raise InputError(
                f"input {index} has {len(ids) + len(suffix)} tokens with its prompt template, "
                f"more than the model's maximum of {limit}; pass truncate=True to cut it"
            )
        if len(suffix) >= limit:
            raise InputError(
                f"the prompt template's suffix alone ({len(suffix)} tokens) fills the model's "
                f"maximum input length {limit}"
            )
        return ids[: limit - len(suffix)] + list(suffix)


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


def _is_pair(item: object) -> bool:
    return (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and all(isinstance(part, str) for part in item)
    )
