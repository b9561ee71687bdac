//! The PyO3 bridge: a [`Backend`] over a Python object with the `trt_tei_runtime` contract,
//! and the `trt_tei_runtime._router` extension module.
//!
//! Every function here that touches Python runs on a backend thread, attached only for the
//! duration of one call, except `run`, which detaches the calling (main) thread for the whole
//! life of the server. With an interactive lane, two backend threads call the same Python
//! object; the runtime says it supports that (`info()["interactive_lane"]`).

use super::{
    Backend, BackendError, BackendFactory, Batch, BatchKind, LoadedBackend, Matrix, ModelInfo,
};
use crate::cli::Args;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// What the backend constructor needs, copied out of the flags so it can cross threads.
#[derive(Debug, Clone)]
pub struct PythonBackendOptions {
    pub class_path: String,
    pub model_id: String,
    pub revision: Option<String>,
    pub dtype: Option<String>,
    pub pooling: Option<String>,
    pub device: Option<String>,
    /// Only passed when set: backends without a `task` argument still load.
    pub task: Option<String>,
    /// The router's batch limits, passed to constructors that accept them (the runtime sizes
    /// its buffers and CUDA graphs with them).
    pub max_batch_tokens: usize,
    pub max_batch_requests: Option<usize>,
    /// Use the runtime's interactive lane if it has one (`--interactive-max-tokens` > 0).
    pub interactive_lane: bool,
    /// Environment for the runtime (hub token, cache), set through `os.environ` because
    /// Python snapshots the process environment at start-up.
    pub env: Vec<(String, String)>,
}

impl PythonBackendOptions {
    pub fn from_args(args: &Args) -> Self {
        let mut env = Vec::new();
        if let Some(token) = &args.hf_token {
            env.push(("HF_TOKEN".to_string(), token.clone()));
        }
        if let Some(cache) = &args.huggingface_hub_cache {
            env.push(("HF_HUB_CACHE".to_string(), cache.clone()));
        }
        Self {
            class_path: args.python_backend_class.clone(),
            model_id: args.model_id.clone(),
            revision: args.revision.clone(),
            dtype: args.dtype.clone(),
            pooling: args.pooling.clone(),
            device: args.device.clone(),
            task: args.task.clone(),
            max_batch_tokens: args.max_batch_tokens,
            max_batch_requests: args.max_batch_requests,
            interactive_lane: args.interactive_max_tokens > 0,
            env,
        }
    }

    pub fn factory(self) -> BackendFactory {
        Box::new(move || load(&self))
    }
}

/// `Type: message` for the HTTP body; the full traceback goes to the log only.
fn describe(py: Python<'_>, err: &PyErr, context: &str) -> String {
    let summary = match err.get_type(py).name() {
        Ok(name) => format!("{name}: {}", err.value(py)),
        Err(_) => err.to_string(),
    };
    let traceback = py
        .import("traceback")
        .and_then(|tb| {
            tb.call_method1(
                "format_exception",
                (err.get_type(py), err.value(py), err.traceback(py)),
            )
        })
        .and_then(|lines| lines.extract::<Vec<String>>())
        .map(|lines| lines.concat())
        .unwrap_or_else(|_| summary.clone());
    tracing::error!("{context}: {summary}\n{traceback}");
    summary
}

fn load(opts: &PythonBackendOptions) -> Result<LoadedBackend, BackendError> {
    Python::attach(|py| {
        let result = (|| -> PyResult<(Py<PyAny>, String, Py<PyAny>)> {
            let environ = py.import("os")?.getattr("environ")?;
            for (k, v) in &opts.env {
                environ.set_item(k, v)?;
            }
            let (module, class) = opts
                .class_path
                .split_once(':')
                .unwrap_or((&opts.class_path, ""));
            let cls = py.import(module)?.getattr(class)?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("model_id", &opts.model_id)?;
            kwargs.set_item("revision", &opts.revision)?;
            kwargs.set_item("dtype", &opts.dtype)?;
            kwargs.set_item("pooling", &opts.pooling)?;
            kwargs.set_item("device", &opts.device)?;
            if let Some(task) = &opts.task {
                kwargs.set_item("task", task)?;
            }
            // Optional keywords go only to constructors that declare them, so a minimal
            // backend with just the contract's five arguments still loads.
            let params = py
                .import("inspect")?
                .call_method1("signature", (&cls,))?
                .getattr("parameters")?;
            let var_keyword = py
                .import("inspect")?
                .getattr("Parameter")?
                .getattr("VAR_KEYWORD")?;
            let mut takes_any = false;
            for p in params.call_method0("values")?.try_iter()? {
                takes_any |= p?.getattr("kind")?.eq(&var_keyword)?;
            }
            for (name, value) in [
                ("max_batch_tokens", Some(opts.max_batch_tokens)),
                ("max_batch_requests", opts.max_batch_requests),
            ] {
                if takes_any || params.contains(name)? {
                    kwargs.set_item(name, value)?;
                }
            }
            let obj = cls.call((), Some(&kwargs))?;
            // JSON is the simplest faithful way to move a nested dict into a Rust struct.
            let info = obj.call_method0("info")?;
            let json: String = py
                .import("json")?
                .call_method1("dumps", (info,))?
                .extract()?;
            let as_f32 = py.import("numpy")?.getattr("ascontiguousarray")?;
            Ok((obj.unbind(), json, as_f32.unbind()))
        })();
        let (obj, json, as_f32) = result.map_err(|e| {
            BackendError::Start(describe(py, &e, &format!("loading {}", opts.class_path)))
        })?;
        let info: ModelInfo = serde_json::from_str(&json)
            .map_err(|e| BackendError::Start(format!("Backend.info() is invalid: {e}: {json}")))?;
        let interactive = (info.interactive_lane && opts.interactive_lane)
            .then(|| interactive_lane(py, &obj, &as_f32))
            .transpose()
            .map_err(|e| {
                BackendError::Start(describe(py, &e, "setting up the interactive lane"))
            })?;
        let mut bulk = PyBackend {
            obj,
            as_f32,
            kwargs: None,
        };
        bulk.health()?;
        Ok(LoadedBackend {
            info,
            bulk: Box::new(bulk),
            interactive,
        })
    })
}

/// The same Python object, called with `interactive=True` from the second thread.
fn interactive_lane(
    py: Python<'_>,
    obj: &Py<PyAny>,
    as_f32: &Py<PyAny>,
) -> PyResult<Box<dyn Backend + Send>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("interactive", true)?;
    Ok(Box::new(PyBackend {
        obj: obj.clone_ref(py),
        as_f32: as_f32.clone_ref(py),
        kwargs: Some(kwargs.unbind()),
    }))
}

struct PyBackend {
    obj: Py<PyAny>,
    /// `numpy.ascontiguousarray`, looked up once.
    as_f32: Py<PyAny>,
    /// Keyword arguments of every forward call: `interactive=True` on the interactive lane,
    /// none on the bulk one (so a runtime without lanes needs no such argument).
    kwargs: Option<Py<PyDict>>,
}

/// Little-endian u32 bytes, written straight into the Python object (no intermediate buffer).
fn u32_bytes<'py>(py: Python<'py>, values: &[u32]) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, values.len() * 4, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(4).zip(values) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

impl PyBackend {
    fn call(&self, py: Python<'_>, kind: BatchKind, batch: &Batch) -> PyResult<Matrix> {
        let method = match kind {
            BatchKind::Pooled => "embed",
            BatchKind::AllTokens => "embed_all",
            BatchKind::Predict => "predict",
        };
        let args = (
            u32_bytes(py, &batch.input_ids)?,
            u32_bytes(py, &batch.token_type_ids)?,
            u32_bytes(py, &batch.position_ids)?,
            u32_bytes(py, &batch.cu_seqlens)?,
            batch.max_length,
        );
        let kwargs = self.kwargs.as_ref().map(|k| k.bind(py));
        let out = self.obj.bind(py).call_method(method, args, kwargs)?;
        let array = self.as_f32.bind(py).call1((out, "float32"))?;
        let shape: Vec<usize> = array.getattr("shape")?.extract()?;
        let [rows, cols] = shape[..] else {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "Backend.{method} must return a 2-D array, got shape {shape:?}"
            )));
        };
        let bytes = array.call_method0("tobytes")?;
        let bytes = bytes.cast::<PyBytes>()?.as_bytes();
        let data = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Matrix { rows, cols, data })
    }
}

impl Backend for PyBackend {
    fn health(&mut self) -> Result<(), BackendError> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method0("health")
                .map(|_| ())
                .map_err(|e| BackendError::Unhealthy(describe(py, &e, "Backend.health()")))
        })
    }

    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError> {
        Python::attach(|py| {
            self.call(py, kind, batch).map_err(|e| {
                let context = format!(
                    "{kind:?} batch of {} sequences / {} tokens failed",
                    batch.num_seqs(),
                    batch.num_tokens()
                );
                BackendError::Inference(describe(py, &e, &context))
            })
        })
    }
}

/// Runs the server with `argv` (as `sys.argv`) and returns the exit code.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> i32 {
    // Detach for the whole server life: the backend thread attaches for each call, and
    // nothing else in the process needs the interpreter.
    py.detach(move || {
        let make: crate::server::MakeBackend =
            Box::new(|args: &Args| Ok(PythonBackendOptions::from_args(args).factory()));
        crate::server::main_with_args(argv, make)
    })
}

#[pymodule]
fn _router(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
