//! A deterministic backend for tests: no Python, no model, same contract.

use super::{
    Backend, BackendError, BackendFactory, Batch, BatchKind, DeviceBackends, Launched,
    LoadedBackend, Matrix, ModelInfo, ModelType,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A token id (the word "poison" in the test tokenizer) that makes the fake backend fail the
/// whole batch, like a Python exception would.
pub const POISON_ID: u32 = 20;
/// A token id (the word "g" in the test tokenizer) that holds a batch at the backend's
/// [`Gate`], when it has one, as a long corpus batch would hold the GPU.
pub const HOLD_ID: u32 = 18;
/// A token id (the word "nan" in the test tokenizer) whose sequence's output is NaN, as a
/// float16 overflow would make it, while the rest of the batch stays finite.
pub const NAN_ID: u32 = 21;
/// A token id (the word "lost" in the test tokenizer) that breaks the fake's device while it
/// runs the batch holding it, as a CUDA error would: that pass raises `DeviceError`, and so
/// does everything after it (see [`FakeBackend::broken`]).
pub const DEVICE_FAIL_ID: u32 = 22;
pub const HIDDEN: usize = 8;

/// What one forward pass looked like, for tests that check how the queue packed batches.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenBatch {
    pub kind: BatchKind,
    pub num_seqs: usize,
    pub num_tokens: usize,
    /// The backend thread that ran it (`model-backend` or `model-interactive`, with
    /// `-<device>` after it on devices other than 0).
    pub thread: String,
    /// The device that ran it.
    pub device: usize,
    /// The first token id of the first sequence after `[CLS]`, to tell batches apart.
    pub first_id: Option<u32>,
    /// Every token's type id (where LoRA adapters' indexes ride).
    pub token_type_ids: Vec<u32>,
}

/// Keeps every forward pass of a batch holding [`HOLD_ID`] running until the test opens it:
/// a slow batch whose end the test controls, instead of a sleep it has to guess.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    open: bool,
    held: usize,
}

impl Gate {
    /// Lets every held pass, and every later one, through.
    pub fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }

    /// How many passes have reached the gate so far (held or let through).
    pub fn held(&self) -> usize {
        self.state.lock().unwrap().held
    }

    fn pass(&self) {
        let mut state = self.state.lock().unwrap();
        state.held += 1;
        while !state.open {
            state = self.changed.wait(state).unwrap();
        }
    }
}

#[derive(Clone)]
pub struct FakeBackend {
    pub info: ModelInfo,
    pub delay: Duration,
    pub healthy: bool,
    pub seen: Arc<Mutex<Vec<SeenBatch>>>,
    pub gate: Option<Arc<Gate>>,
    /// Which device this fake stands for (what the Python bridge passes as `device=`).
    pub device: usize,
    /// Once set, every forward pass and health check fails as a lost GPU would
    /// (`DeviceError`), until the test clears it.
    pub broken: Arc<AtomicBool>,
    /// Whether the bulk lane pipelines, as a GPU runtime's does ([`Backend::pipelines`]): a
    /// batch runs when launched, and reading its result fails if the device broke since, as
    /// every CUDA call fails once a GPU is lost.
    pub pipelined: bool,
    /// Per pipelined batch whose result was read: its first id (as [`SeenBatch::first_id`])
    /// and how many batches had been launched by then.
    pub finished: Arc<Mutex<Vec<FinishedBatch>>>,
    /// A pipelined batch's result is ready only once this many batches were launched (or
    /// after 5 s): a device still busy while the host launches the next ones.
    pub ready_after_launches: usize,
    /// The name of the thread of each [`Backend::warm`] call.
    pub warmed: Arc<Mutex<Vec<String>>>,
}

/// A pipelined batch read back: its first id and how many batches had been launched by then.
pub type FinishedBatch = (Option<u32>, usize);

/// Per-token hidden state: any fixed function of (token, position, column) will do, as long as
/// tests can recompute it.
pub fn token_state(id: u32, position: u32, col: usize) -> f32 {
    ((id as f32 + 1.0) * (col as f32 + 1.0)).sin() + 0.01 * position as f32
}

/// Mean of the token states, as a mean-pooling model would return.
pub fn pooled(ids: &[u32], positions: &[u32]) -> Vec<f32> {
    (0..HIDDEN)
        .map(|c| {
            ids.iter()
                .zip(positions)
                .map(|(&i, &p)| token_state(i, p, c))
                .sum::<f32>()
                / ids.len() as f32
        })
        .collect()
}

/// Logits: column `l` is the mean token id scaled per label, so scores differ by input.
pub fn logits(ids: &[u32], num_labels: usize) -> Vec<f32> {
    let mean = ids.iter().map(|&i| i as f32).sum::<f32>() / ids.len() as f32;
    (0..num_labels)
        .map(|l| (mean / 100.0) * (l as f32 + 1.0) - l as f32 * 0.5)
        .collect()
}

/// A fake SPLADE vector: each distinct token id is active, weighted by how often it occurs
/// over 10; (index, value) pairs in index order.
pub fn sparse(ids: &[u32]) -> Vec<(u32, f32)> {
    let mut counts: BTreeMap<u32, f32> = BTreeMap::new();
    for &i in ids {
        *counts.entry(i).or_default() += 0.1;
    }
    counts.into_iter().collect()
}

impl FakeBackend {
    /// A SPLADE model whose vocabulary is the fake tokenizer's.
    pub fn sparse_info() -> ModelInfo {
        ModelInfo {
            model_type: ModelType::Sparse,
            hidden_size: 30522,
            pooling: Some("splade".into()),
            ..Self::info()
        }
    }

    pub fn info() -> ModelInfo {
        ModelInfo {
            model_type: ModelType::Embedding,
            architecture: "FakeModel".into(),
            tokenizer_path: String::new(),
            hidden_size: HIDDEN,
            max_input_length: 16,
            position_offset: 0,
            pooling: Some("mean".into()),
            num_labels: 0,
            id2label: None,
            score_activation: None,
            prompts: Some([("query".to_string(), "query : ".to_string())].into()),
            default_prompt_name: None,
            pair_template: None,
            adapters: None,
            lora_adapters: None,
            adapter_type_stride: None,
            dtype: Some("float32".into()),
            device: Some("cpu".into()),
            interactive_lane: false,
            devices: None,
            image_input: None,
            text_padding: None,
            late_interaction: None,
        }
    }

    pub fn classifier_info(num_labels: usize) -> ModelInfo {
        ModelInfo {
            model_type: if num_labels == 1 {
                ModelType::Reranker
            } else {
                ModelType::Classifier
            },
            hidden_size: HIDDEN,
            num_labels,
            pooling: None,
            ..Self::info()
        }
    }

    pub fn new(info: ModelInfo) -> Self {
        Self {
            info,
            delay: Duration::ZERO,
            healthy: true,
            seen: Arc::default(),
            gate: None,
            device: 0,
            broken: Arc::default(),
            pipelined: false,
            finished: Arc::default(),
            ready_after_launches: 0,
            warmed: Arc::default(),
        }
    }

    pub fn factory() -> BackendFactory {
        Self::new(Self::info()).into_factory()
    }

    /// Like the Python bridge, builds a second lane (a clone sharing `seen` and `gate`) when
    /// the info says the runtime has one.
    pub fn into_factory(self) -> BackendFactory {
        Self::devices_factory(vec![self])
    }

    /// `n` fakes sharing this one's `seen`, `gate` and settings, for devices `0..n`, each with
    /// its own `broken` switch; the info lists `n` devices named `fake:<i>`.
    pub fn on_devices(mut self, n: usize) -> Vec<FakeBackend> {
        self.info.devices = Some((0..n).map(|i| format!("fake:{i}")).collect());
        (0..n)
            .map(|device| FakeBackend {
                device,
                broken: Arc::default(),
                ..self.clone()
            })
            .collect()
    }

    /// One fake per device, as the Python bridge builds one backend per device; the first
    /// fake's info is the model's.
    pub fn devices_factory(fakes: Vec<FakeBackend>) -> BackendFactory {
        Box::new(move || {
            let info = fakes[0].info.clone();
            let devices = fakes
                .into_iter()
                .map(|fake| DeviceBackends {
                    // Queries are not pipelined (the Python bridge's interactive lane is not).
                    interactive: fake.info.interactive_lane.then(|| {
                        Box::new(FakeBackend {
                            pipelined: false,
                            ..fake.clone()
                        }) as Box<dyn Backend + Send>
                    }),
                    bulk: Box::new(fake),
                })
                .collect();
            Ok(LoadedBackend {
                info,
                devices,
                images: None,
            })
        })
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    fn device_error(&self) -> BackendError {
        BackendError::Device(format!(
            "DeviceError: CUDA error: device {} was lost",
            self.device
        ))
    }
}

impl Backend for FakeBackend {
    fn pipelines(&self) -> bool {
        self.pipelined
    }

    fn warm(&mut self) {
        let thread = std::thread::current().name().unwrap_or_default().into();
        self.warmed.lock().unwrap().push(thread);
    }

    fn launch(&mut self, kind: BatchKind, batch: &Batch) -> Result<Launched, BackendError> {
        let matrix = self.forward(kind, batch)?;
        if !self.pipelined {
            return Ok(Launched::done(matrix));
        }
        let (broken, finished, seen) = (
            self.broken.clone(),
            self.finished.clone(),
            self.seen.clone(),
        );
        let first_id = batch.input_ids.get(1).copied();
        let lost = self.device_error();
        let ready_after = self.ready_after_launches;
        Ok(Launched::new(move || {
            let waiting_since = std::time::Instant::now();
            while seen.lock().unwrap().len() < ready_after
                && waiting_since.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            let launched = seen.lock().unwrap().len();
            finished.lock().unwrap().push((first_id, launched));
            if broken.load(Ordering::SeqCst) {
                return Err(lost);
            }
            Ok(matrix)
        }))
    }

    fn health(&mut self) -> Result<(), BackendError> {
        if self.is_broken() {
            return Err(self.device_error());
        }
        if self.healthy {
            Ok(())
        } else {
            Err(BackendError::Unhealthy("RuntimeError: CUDA error".into()))
        }
    }

    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError> {
        self.seen.lock().unwrap().push(SeenBatch {
            kind,
            num_seqs: batch.num_seqs(),
            num_tokens: batch.num_tokens(),
            thread: std::thread::current().name().unwrap_or_default().into(),
            device: self.device,
            first_id: batch.input_ids.get(1).copied(),
            token_type_ids: batch.token_type_ids.to_vec(),
        });
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if let Some(gate) = self
            .gate
            .as_ref()
            .filter(|_| batch.input_ids.contains(&HOLD_ID))
        {
            gate.pass();
        }
        if batch.input_ids.contains(&DEVICE_FAIL_ID) {
            self.broken.store(true, Ordering::SeqCst);
        }
        if self.is_broken() {
            return Err(self.device_error());
        }
        if batch.input_ids.contains(&POISON_ID) {
            return Err(BackendError::Inference("ValueError: poison token".into()));
        }
        let seqs = batch.cu_seqlens.windows(2).map(|w| {
            let (a, b) = (w[0] as usize, w[1] as usize);
            (&batch.input_ids[a..b], &batch.position_ids[a..b])
        });
        let nan_if_poisoned = |ids: &[u32], row: Vec<f32>| {
            if ids.contains(&NAN_ID) {
                vec![f32::NAN; row.len()]
            } else {
                row
            }
        };
        let (cols, data): (usize, Vec<f32>) = match kind {
            BatchKind::Pooled => (
                HIDDEN,
                seqs.flat_map(|(i, p)| nan_if_poisoned(i, pooled(i, p)))
                    .collect(),
            ),
            BatchKind::AllTokens => (
                HIDDEN,
                batch
                    .input_ids
                    .iter()
                    .zip(&batch.position_ids)
                    .flat_map(|(&i, &p)| (0..HIDDEN).map(move |c| token_state(i, p, c)))
                    .collect(),
            ),
            BatchKind::Sparse => {
                // k (index, value) pairs per row; shorter rows end in (0, 0) pairs.
                let rows: Vec<Vec<(u32, f32)>> = seqs.map(|(i, _)| sparse(i)).collect();
                let k = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
                let mut data = Vec::with_capacity(rows.len() * 2 * k);
                for row in &rows {
                    data.extend(row.iter().flat_map(|&(i, v)| [i as f32, v]));
                    data.resize(data.len() + 2 * (k - row.len()), 0.0);
                }
                (2 * k, data)
            }
            // A row per image: its first pixels, so tests can tell images apart.
            BatchKind::Images => {
                let per_image = batch.pixels.len() / batch.num_seqs().max(1);
                let data = batch
                    .pixels
                    .chunks(per_image.max(1))
                    .flat_map(|image| (0..HIDDEN).map(|c| image.get(c).copied().unwrap_or(0.0)))
                    .collect();
                (HIDDEN, data)
            }
            // The runtime's rule on the fake's token states (no skiplist: the fake serves
            // no late-interaction model).
            BatchKind::MaxSim => {
                let data = seqs
                    .enumerate()
                    .map(|(s, (ids, positions))| {
                        let doc: Vec<Vec<f32>> = ids
                            .iter()
                            .zip(positions)
                            .map(|(&i, &p)| (0..HIDDEN).map(|c| token_state(i, p, c)).collect())
                            .collect();
                        fake_maxsim(batch.query_of(s), &doc)
                    })
                    .collect();
                (1, data)
            }
            BatchKind::Predict => {
                let n = self.info.num_labels;
                (
                    n,
                    seqs.flat_map(|(i, _)| nan_if_poisoned(i, logits(i, n)))
                        .collect(),
                )
            }
        };
        Ok(Matrix {
            rows: data.len() / cols,
            cols,
            data,
        })
    }
}

/// The sum over the query's rows (`HIDDEN` values each) of the best dot product with a
/// document row.
fn fake_maxsim(query: &[f32], doc: &[Vec<f32>]) -> f32 {
    query
        .chunks(HIDDEN)
        .map(|q| {
            doc.iter()
                .map(|d| q.iter().zip(d).map(|(a, b)| a * b).sum::<f32>())
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .sum()
}
