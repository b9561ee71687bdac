//! The backend contract: what the router hands a model runtime (a packed [`Batch`]), what it
//! gets back (a [`Matrix`]), and the [`Backend`] trait a runtime implements.

/// One forward pass worth of sequences, packed end to end with no padding.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub input_ids: Vec<u32>,
    pub token_type_ids: Vec<u32>,
    pub position_ids: Vec<u32>,
    /// `n_seqs + 1` offsets into the flat arrays, starting at 0.
    pub cu_seqlens: Vec<u32>,
    /// [`BatchKind::Images`]: every image's float32 `[C, H, W]` pixels, end to end; its
    /// sequence in the arrays above is `tokens_per_image` placeholder tokens, which is what
    /// the image costs of the batch's token budget. Empty for texts.
    pub pixels: Vec<f32>,
    /// [`BatchKind::MaxSim`]: the vectors of the queries the documents are scored against,
    /// row-major and end to end (rows of the model's embedding size). Empty otherwise.
    pub queries: Vec<f32>,
    /// [`BatchKind::MaxSim`]: per sequence, the `[start, end)` values of its query in
    /// [`Batch::queries`], two numbers a sequence. Empty otherwise.
    pub query_spans: Vec<u32>,
}

impl Batch {
    /// A batch of no sequences, ready for [`Batch::push_sequence`].
    pub fn empty() -> Self {
        Self {
            cu_seqlens: vec![0],
            ..Default::default()
        }
    }

    /// Appends one sequence: its token ids, type ids and positions, of equal length.
    pub fn push_sequence(
        &mut self,
        input_ids: &[u32],
        token_type_ids: &[u32],
        position_ids: &[u32],
    ) {
        self.input_ids.extend_from_slice(input_ids);
        self.token_type_ids.extend_from_slice(token_type_ids);
        self.position_ids.extend_from_slice(position_ids);
        self.cu_seqlens.push(self.input_ids.len() as u32);
    }

    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// Appends one image's pixels (after its placeholder sequence).
    pub fn push_pixels(&mut self, pixels: &[f32]) {
        self.pixels.extend_from_slice(pixels);
    }

    /// Gives the last sequence pushed its query's vectors ([`BatchKind::MaxSim`]); stored
    /// once for consecutive sequences of the same query (a request's documents).
    pub fn push_query(&mut self, query: &[f32]) {
        let last = self
            .query_spans
            .rchunks_exact(2)
            .next()
            .map(|span| span[0] as usize..span[1] as usize)
            .filter(|span| self.queries[span.clone()] == *query);
        let span = last.unwrap_or_else(|| {
            let start = self.queries.len();
            self.queries.extend_from_slice(query);
            start..self.queries.len()
        });
        self.query_spans
            .extend_from_slice(&[span.start as u32, span.end as u32]);
    }

    /// Sequence `i`'s query's vectors; empty when the batch carries none.
    pub fn query_of(&self, i: usize) -> &[f32] {
        match self.query_spans.get(2 * i..2 * i + 2) {
            Some(span) => &self.queries[span[0] as usize..span[1] as usize],
            None => &[],
        }
    }

    /// A batch of only the sequences at `seqs` (ascending indices), packed again.
    pub fn select(&self, seqs: &[usize]) -> Batch {
        let mut out = Batch::empty();
        let per_image = self.pixels.len() / self.num_seqs().max(1);
        for &i in seqs {
            out.push_pixels(&self.pixels[i * per_image..(i + 1) * per_image]);
            let (a, b) = (self.cu_seqlens[i] as usize, self.cu_seqlens[i + 1] as usize);
            out.push_sequence(
                &self.input_ids[a..b],
                &self.token_type_ids[a..b],
                &self.position_ids[a..b],
            );
            if !self.query_spans.is_empty() {
                out.push_query(self.query_of(i));
            }
        }
        out
    }
}

/// What a batch asks of the model. Batches are homogeneous: the runtime exposes one method per
/// kind, so the queue never mixes kinds in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    /// Pooled sentence embeddings, `[n_seqs, hidden]`.
    Pooled,
    /// Per-token hidden states, `[n_tokens, hidden]`.
    AllTokens,
    /// Classification logits, `[n_seqs, num_labels]`.
    Predict,
    /// SPLADE sparse vectors, `[n_seqs, 2k]`: per row k (vocabulary index, value) pairs, the
    /// index an integral float, in index order; a pair of value 0 is padding. k varies from
    /// batch to batch.
    Sparse,
    /// Image embeddings (text-and-image models), `[n_images, dim]`, of [`Batch::pixels`].
    Images,
    /// Late interaction (ColBERT): each document's MaxSim score against its own query's
    /// vectors ([`Batch::queries`]), `[n_seqs, 1]`; the documents' token vectors stay on
    /// the device.
    MaxSim,
}

/// A dense row-major float matrix returned by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum BackendError {
    #[error("could not start the model backend: {0}")]
    Start(String),
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("model backend is unhealthy: {0}")]
    Unhealthy(String),
    #[error("model backend has stopped")]
    Stopped,
    /// The device itself failed (the runtime raised `DeviceError`): the batch is lost and the
    /// device takes no more work. Never re-run apart: no input is to blame.
    #[error("the device running this request failed: {0}")]
    Device(String),
    /// A device that had failed gave back a batch it was handed before; it runs elsewhere.
    #[error("the device failed before this batch ran")]
    Refused,
    /// Checked per sequence: the other sequences of the batch are still served.
    #[error("inference failed: the model returned NaN or infinite values for this input (e.g. a float16 overflow)")]
    NonFinite,
}

/// Turns an encoded image (PNG, JPEG, WebP, GIF, ...) into the float32 `[C, H, W]` pixels
/// the model takes, exactly as the checkpoint's own processor does. Called from many worker
/// threads at once, never from a backend thread.
pub trait ImagePreprocessor: Send + Sync {
    /// The pixels, or why the bytes are refused (no readable image, a truncated one, more
    /// than `max_pixels` pixels): a message about the input, not the server.
    fn preprocess(&self, data: &[u8], max_pixels: u64) -> Result<Vec<f32>, String>;

    /// [`Self::preprocess`] where it can run without the Python interpreter (the router's own
    /// decoding), else `None`: the caller then runs `preprocess` on a thread that may hold
    /// the interpreter's lock. Such a thread must not be one that yields its core to every
    /// other thread, or the lock it holds would hold up the batches.
    fn preprocess_natively(
        &self,
        _data: &[u8],
        _max_pixels: u64,
    ) -> Option<Result<Vec<f32>, String>> {
        None
    }
}

/// Which queue and backend thread a request's sequences go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Small requests (queries): their own queue and, when the runtime has one, their own
    /// backend thread and high-priority stream.
    Interactive,
    /// Everything else (corpus backfills): fills the capacity the interactive lane leaves.
    Bulk,
}

impl Lane {
    /// Both lanes, most urgent first: the order a single-thread backend serves them in.
    pub const PRIORITY: [Lane; 2] = [Lane::Interactive, Lane::Bulk];

    /// The `lane` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Interactive => "interactive",
            Lane::Bulk => "bulk",
        }
    }

    /// Position in per-lane arrays, in [`Lane::PRIORITY`] order.
    pub fn index(self) -> usize {
        match self {
            Lane::Interactive => 0,
            Lane::Bulk => 1,
        }
    }
}

/// The engine behind the router. Called only from its lane's backend thread.
pub trait Backend {
    fn health(&mut self) -> Result<(), BackendError>;
    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError>;

    /// Whether [`Backend::launch`] returns before its batch has run (a GPU runtime): the
    /// bulk thread then starts the next batch before it reads this one back.
    fn pipelines(&self) -> bool {
        false
    }

    /// Starts a batch and returns once the device holds its work; [`Launched::finish`]
    /// reads its result. By default the whole pass runs here.
    fn launch(&mut self, kind: BatchKind, batch: &Batch) -> Result<Launched, BackendError> {
        self.forward(kind, batch).map(Launched::done)
    }

    /// Runs the host side of the lane's last query again without the device, so that the
    /// next query finds its code and data in the CPU's caches; the interactive thread calls
    /// it while it spins between queries (`--query-warm-us`). Errors are the next query's to
    /// report. By default nothing.
    fn warm(&mut self) {}
}

/// A batch started by [`Backend::launch`], its result not read yet.
pub struct Launched(Box<dyn FnOnce() -> Result<Matrix, BackendError> + Send>);

impl Launched {
    pub fn new(finish: impl FnOnce() -> Result<Matrix, BackendError> + Send + 'static) -> Self {
        Self(Box::new(finish))
    }

    /// A batch that has run already: `finish` returns `matrix`.
    pub fn done(matrix: Matrix) -> Self {
        Self::new(move || Ok(matrix))
    }

    /// Waits for the batch and returns its result.
    pub fn finish(self) -> Result<Matrix, BackendError> {
        (self.0)()
    }
}

/// A panic inside one forward pass must fail that batch, not take the server down.
pub(in crate::backend) fn guarded<T>(
    f: impl FnOnce() -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = crate::panics::panic_message(panic.as_ref()).unwrap_or("unknown panic");
        tracing::error!("backend panicked: {msg}");
        Err(BackendError::Inference(format!("backend panicked: {msg}")))
    })
}
