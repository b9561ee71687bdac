//! The PyO3 bridge: a [`Backend`] over a Python object with the `trt_tei_runtime` contract.
//!
//! Every function here that touches Python runs on a backend thread, attached only for the
//! duration of one call. With an interactive lane, two backend threads call the same Python
//! object; the runtime says it supports that (`info()["interactive_lane"]`). With several
//! devices (`info()["devices"]`), every device's threads call that same object too, each call
//! naming its device (`device=i`).

use super::process::DeviceWorkers;
use super::{
    Backend, BackendError, Batch, BatchKind, DeviceBackends, ImagePreprocessor, ImageSteps,
    Launched, LoadedBackend, Matrix, ModelInfo,
};
use crate::images::pixels::RustImages;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::Arc;

/// What the backend constructor needs, copied out of the flags so it can cross threads (and,
/// as JSON, to a device worker process).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PythonBackendOptions {
    pub class_path: String,
    pub model_id: String,
    pub revision: Option<String>,
    pub dtype: Option<String>,
    pub pooling: Option<String>,
    pub device: Option<String>,
    /// `--devices` as given (`cuda:0,cuda:1`, `all`, `cpu,cpu`): passed as `devices=` only
    /// when set, and then the constructor must accept it.
    pub devices: Option<String>,
    /// Only passed when set: backends without a `task` argument still load.
    pub task: Option<String>,
    /// `--max-active-dims` (SPLADE models): only passed when set.
    pub max_active_dims: Option<u32>,
    /// The router's batch limits, passed to constructors that accept them (the runtime sizes
    /// its buffers and CUDA graphs with them).
    pub max_batch_tokens: usize,
    pub max_batch_requests: Option<usize>,
    /// `--max-bulk-step-ms`: only passed when set, to constructors that accept it.
    pub max_bulk_step_ms: Option<f64>,
    /// `--memory-fraction`, to constructors that accept it.
    #[serde(default)]
    pub memory_fraction: Option<f64>,
    /// Use the runtime's interactive lane if it has one (`--interactive-max-tokens` > 0).
    pub interactive_lane: bool,
    /// Environment for the runtime (hub token, cache), set through `os.environ` because
    /// Python snapshots the process environment at start-up.
    pub env: Vec<(String, String)>,
    /// `--device-workers`: several devices in this process, or a worker process each
    /// (`backend::process`).
    pub device_workers: DeviceWorkers,
    /// `--json-output`, for the logs of device workers.
    pub json_logs: bool,
    /// `--lora-adapter`s of this model: name -> PEFT folder. Passed as `lora_adapters=` only
    /// when there are some, and then the constructor must accept it.
    #[serde(default)]
    pub lora_adapters: std::collections::BTreeMap<String, String>,
}

/// Whether the runtime says the device itself failed: an exception of a class named
/// `DeviceError` (`trt_tei_runtime.errors.DeviceError`, or a subclass, or a third-party class
/// of that name). Looked up only on the error path.
fn is_device_error(py: Python<'_>, err: &PyErr) -> bool {
    is_of_class(py, err, "DeviceError")
}

/// Whether `err`'s class, or one of its bases, is named `name`.
fn is_of_class(py: Python<'_>, err: &PyErr, name: &str) -> bool {
    let Ok(mro) = err.get_type(py).getattr("__mro__") else {
        return false;
    };
    let Ok(classes) = mro.try_iter() else {
        return false;
    };
    classes.flatten().any(|class| {
        class
            .getattr("__name__")
            .and_then(|name| name.extract::<String>())
            .is_ok_and(|class_name| class_name == name)
    })
}

pub(in crate::backend) fn summary(py: Python<'_>, err: &PyErr) -> String {
    match err.get_type(py).name() {
        Ok(name) => format!("{name}: {}", err.value(py)),
        Err(_) => err.to_string(),
    }
}

fn traceback(py: Python<'_>, err: &PyErr) -> String {
    py.import("traceback")
        .and_then(|tb| {
            tb.call_method1(
                "format_exception",
                (err.get_type(py), err.value(py), err.traceback(py)),
            )
        })
        .and_then(|lines| lines.extract::<Vec<String>>())
        .map(|lines| lines.concat())
        .unwrap_or_else(|_| summary(py, err))
}

/// `Type: message` for the HTTP body; the full traceback goes to the log only.
fn describe(py: Python<'_>, err: &PyErr, context: &str) -> String {
    let summary = summary(py, err);
    tracing::error!("{context}: {summary}\n{}", traceback(py, err));
    summary
}

/// Whether a start-up failure is a configuration mistake (a missing folder, a bad flag value,
/// a hub that cannot be reached): the runtime's own errors and `OSError`s. Those are reported
/// in one line; a traceback is for the unexpected.
fn is_configuration_error(py: Python<'_>, err: &PyErr) -> bool {
    if err.is_instance_of::<pyo3::exceptions::PyOSError>(py) {
        return true;
    }
    py.import("trt_tei_runtime.errors")
        .and_then(|m| m.getattr("RuntimeErrorBase"))
        .is_ok_and(|base| err.value(py).is_instance(&base).unwrap_or(false))
}

/// A start-up failure: one line for configuration mistakes (the traceback at debug level),
/// the traceback for anything else.
fn describe_start_error(py: Python<'_>, err: &PyErr, context: &str) -> String {
    if is_configuration_error(py, err) {
        tracing::debug!("{context}: {}", traceback(py, err));
        summary(py, err)
    } else {
        describe(py, err, context)
    }
}

fn set_environment(py: Python<'_>, env: &[(String, String)]) -> PyResult<()> {
    let environ = py.import("os")?.getattr("environ")?;
    for (k, v) in env {
        environ.set_item(k, v)?;
    }
    Ok(())
}

/// The `module:Class` of `--python-backend-class`, with a message that names the flag.
pub(in crate::backend) fn backend_class<'py>(
    py: Python<'py>,
    class_path: &str,
) -> Result<Bound<'py, PyAny>, BackendError> {
    let (module, class) = class_path.split_once(':').unwrap_or((class_path, ""));
    let fail = |e: PyErr| {
        BackendError::Start(format!(
            "`--python-backend-class {class_path}` cannot be loaded: {}",
            summary(py, &e)
        ))
    };
    py.import(module)
        .map_err(fail)?
        .getattr(class)
        .map_err(fail)
}

/// The constructor's keyword arguments from the flags, and whether it accepts `devices`.
/// Optional keywords go only to constructors that declare them (or take `**kwargs`), so a
/// minimal backend with just the contract's five arguments still loads.
fn constructor_kwargs<'py>(
    py: Python<'py>,
    cls: &Bound<'py, PyAny>,
    opts: &PythonBackendOptions,
) -> PyResult<(Bound<'py, PyDict>, bool)> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("model_id", &opts.model_id)?;
    kwargs.set_item("revision", &opts.revision)?;
    kwargs.set_item("dtype", &opts.dtype)?;
    kwargs.set_item("pooling", &opts.pooling)?;
    kwargs.set_item("device", &opts.device)?;
    if let Some(task) = &opts.task {
        kwargs.set_item("task", task)?;
    }
    if let Some(k) = opts.max_active_dims {
        kwargs.set_item("max_active_dims", k)?;
    }
    let inspect = py.import("inspect")?;
    let params = inspect
        .call_method1("signature", (cls,))?
        .getattr("parameters")?;
    let var_keyword = inspect.getattr("Parameter")?.getattr("VAR_KEYWORD")?;
    let mut takes_any = false;
    for p in params.call_method0("values")?.try_iter()? {
        takes_any |= p?.getattr("kind")?.eq(&var_keyword)?;
    }
    let accepts = |name: &str| -> PyResult<bool> { Ok(takes_any || params.contains(name)?) };
    for (name, value) in [
        ("max_batch_tokens", Some(opts.max_batch_tokens)),
        ("max_batch_requests", opts.max_batch_requests),
    ] {
        if accepts(name)? {
            kwargs.set_item(name, value)?;
        }
    }
    for (name, value) in [
        ("max_bulk_step_ms", opts.max_bulk_step_ms),
        ("memory_fraction", opts.memory_fraction),
    ] {
        if let Some(value) = value {
            if accepts(name)? {
                kwargs.set_item(name, value)?;
            }
        }
    }
    if !opts.lora_adapters.is_empty() {
        if !accepts("lora_adapters")? {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "`--lora-adapter` was given, but the backend class takes no `lora_adapters` \
                 argument",
            ));
        }
        kwargs.set_item("lora_adapters", &opts.lora_adapters)?;
    }
    Ok((kwargs, accepts("devices")?))
}

/// The backend in this process, every device's lanes over one Python object.
pub(in crate::backend) fn load(opts: &PythonBackendOptions) -> Result<LoadedBackend, BackendError> {
    Python::attach(|py| {
        // Before any import: huggingface_hub reads its settings when it is imported.
        set_environment(py, &opts.env)
            .map_err(|e| BackendError::Start(describe(py, &e, "setting the environment")))?;
        let cls = backend_class(py, &opts.class_path)?;
        let start_error = |e: PyErr| {
            BackendError::Start(describe_start_error(
                py,
                &e,
                &format!("loading {}", opts.class_path),
            ))
        };
        let (kwargs, accepts_devices) = constructor_kwargs(py, &cls, opts).map_err(start_error)?;
        if let Some(devices) = &opts.devices {
            if !accepts_devices {
                return Err(BackendError::Start(format!(
                    "`--devices {devices}` was given, but `{}` takes no `devices` argument: \
                     it serves one device (choose it with `--device`)",
                    opts.class_path
                )));
            }
            kwargs.set_item("devices", devices).map_err(start_error)?;
        }
        let result = (|| -> PyResult<(Py<PyAny>, String, Py<PyAny>)> {
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
        let (obj, json, as_f32) = result.map_err(start_error)?;
        let info: ModelInfo = serde_json::from_str(&json)
            .map_err(|e| BackendError::Start(format!("Backend.info() is invalid: {e}: {json}")))?;
        let names = info.device_names();
        let lanes = info.interactive_lane && opts.interactive_lane;
        let mut devices = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            // `device=` only with several devices, so a one-device runtime needs no such
            // argument.
            let device = (names.len() > 1).then_some(i);
            let mut lanes = device_lanes(py, &obj, &as_f32, device, lanes).map_err(|e| {
                BackendError::Start(describe(py, &e, "setting up the backend's lanes"))
            })?;
            match lanes.bulk.health() {
                Ok(()) => {}
                // One device fails start-up as it always has.
                Err(err) if device.is_none() && !matches!(err, BackendError::Device(_)) => {
                    return Err(err)
                }
                Err(BackendError::Device(m) | BackendError::Unhealthy(m)) => {
                    return Err(BackendError::Start(format!(
                        "device {i} ({name}) failed its health check: {m}"
                    )))
                }
                Err(err) => return Err(err),
            }
            devices.push(lanes);
        }
        let images = info.image_input.as_ref().map(|input| {
            let runtime = Arc::new(PyImages {
                obj: obj.clone_ref(py),
                as_f32: as_f32.clone_ref(py),
            }) as Arc<dyn ImagePreprocessor>;
            image_preprocessor(input.steps.as_ref(), runtime)
        });
        Ok(LoadedBackend {
            info,
            devices,
            images,
        })
    })
}

/// The router's own preprocessing where it matches the runtime's steps, else the runtime's.
fn image_preprocessor(
    steps: Option<&ImageSteps>,
    runtime: Arc<dyn ImagePreprocessor>,
) -> Arc<dyn ImagePreprocessor> {
    let rust = steps
        .ok_or_else(|| "the runtime lists no steps".to_string())
        .and_then(|steps| RustImages::new(steps, Some(runtime.clone())));
    match rust {
        Ok(images) => {
            tracing::info!("images are preprocessed in Rust");
            Arc::new(images)
        }
        Err(why) => {
            tracing::info!("images are preprocessed by the runtime: {why}");
            runtime
        }
    }
}

/// `Backend.preprocess_image` of the runtime, called from the router's worker threads
/// (Pillow and numpy release the interpreter while they decode and resize).
struct PyImages {
    obj: Py<PyAny>,
    as_f32: Py<PyAny>,
}

impl ImagePreprocessor for PyImages {
    fn preprocess(&self, data: &[u8], max_pixels: u64) -> Result<Vec<f32>, String> {
        Python::attach(|py| {
            let pixels = self
                .obj
                .bind(py)
                .call_method1("preprocess_image", (PyBytes::new(py, data), max_pixels))
                .and_then(|out| self.as_f32.bind(py).call1((out, "float32")))
                .and_then(|array| array.call_method0("tobytes"))
                .and_then(|bytes| Ok(f32s(bytes.cast::<PyBytes>()?.as_bytes())));
            pixels.map_err(|e| {
                // The runtime's `InputError` is about the image; anything else is a fault,
                // logged with its traceback.
                if is_of_class(py, &e, "InputError") {
                    e.value(py).to_string()
                } else {
                    describe(py, &e, "Backend.preprocess_image")
                }
            })
        })
    }
}

/// Little-endian float32 bytes as values.
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian float32 bytes of `values`, written straight into the Python object.
fn f32_bytes<'py>(py: Python<'py>, values: &[f32]) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, values.len() * 4, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(4).zip(values) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

/// Keyword arguments of one lane's calls, `None` when there are none.
fn call_kwargs(
    py: Python<'_>,
    interactive: bool,
    device: Option<usize>,
) -> PyResult<Option<Py<PyDict>>> {
    if !interactive && device.is_none() {
        return Ok(None);
    }
    let kwargs = PyDict::new(py);
    if interactive {
        kwargs.set_item("interactive", true)?;
    }
    if let Some(device) = device {
        kwargs.set_item("device", device)?;
    }
    Ok(Some(kwargs.unbind()))
}

/// `Backend.pipelines(device=i)` where the runtime has it (an older or minimal runtime has
/// not: its batches then run through `forward`).
fn runtime_pipelines(obj: &Bound<'_, PyAny>, kwargs: Option<&Py<PyDict>>) -> PyResult<bool> {
    if !obj.hasattr("pipelines")? || !obj.hasattr("launch")? {
        return Ok(false);
    }
    let kwargs = kwargs.map(|k| k.bind(obj.py()));
    obj.call_method("pipelines", (), kwargs)?.is_truthy()
}

/// One device's backends over the same Python object: its bulk lane, and its interactive lane
/// (called with `interactive=True` from a second thread) when the runtime has one.
fn device_lanes(
    py: Python<'_>,
    obj: &Py<PyAny>,
    as_f32: &Py<PyAny>,
    device: Option<usize>,
    interactive: bool,
) -> PyResult<DeviceBackends> {
    let lane = |interactive: bool| -> PyResult<Box<dyn Backend + Send>> {
        let health_kwargs = call_kwargs(py, false, device)?;
        Ok(Box::new(PyBackend {
            obj: obj.clone_ref(py),
            as_f32: as_f32.clone_ref(py),
            kwargs: call_kwargs(py, interactive, device)?,
            pipelines: !interactive && runtime_pipelines(obj.bind(py), health_kwargs.as_ref())?,
            warms: interactive && obj.bind(py).hasattr("warm_query")?,
            health_kwargs,
        }))
    };
    Ok(DeviceBackends {
        bulk: lane(false)?,
        interactive: interactive.then(|| lane(true)).transpose()?,
    })
}

struct PyBackend {
    obj: Py<PyAny>,
    /// `numpy.ascontiguousarray`, looked up once.
    as_f32: Py<PyAny>,
    /// Keyword arguments of every forward call: `interactive=True` on the interactive lane,
    /// `device=i` with several devices, none otherwise (so a runtime without lanes or devices
    /// needs no such argument).
    kwargs: Option<Py<PyDict>>,
    /// Keyword arguments of `health()`: `device=i` with several devices.
    health_kwargs: Option<Py<PyDict>>,
    /// The bulk lane of a runtime whose `pipelines(device)` says so: batches go through
    /// `launch` (see [`Backend::pipelines`]).
    pipelines: bool,
    /// The interactive lane of a runtime with `warm_query(device)` (see [`Backend::warm`]).
    warms: bool,
}

/// A Python exception as the router's error: `DeviceError` means the device broke, anything
/// else is `other`'s (the failing input's, or the health check's).
fn backend_error(
    py: Python<'_>,
    err: &PyErr,
    context: &str,
    other: fn(String) -> BackendError,
) -> BackendError {
    let message = describe(py, err, context);
    if is_device_error(py, err) {
        BackendError::Device(message)
    } else {
        other(message)
    }
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
        let method = method_name(kind);
        let kwargs = self.kwargs.as_ref().map(|k| k.bind(py));
        let out = if kind == BatchKind::Images {
            let pixels = f32_bytes(py, &batch.pixels)?;
            self.obj.bind(py).call_method(method, (pixels,), kwargs)?
        } else if kind == BatchKind::MaxSim {
            let (ids, types, positions, cu_seqlens) = batch_arrays(py, batch)?;
            let (queries, spans) = query_arrays(py, batch)?;
            let args = (ids, types, positions, cu_seqlens, queries, spans);
            self.obj.bind(py).call_method(method, args, kwargs)?
        } else {
            let args = batch_arrays(py, batch)?;
            self.obj.bind(py).call_method(method, args, kwargs)?
        };
        to_matrix(&out, self.as_f32.bind(py), method)
    }

    /// `Backend.launch(method, *arrays, **kwargs)`: the Python `Launched` object.
    fn call_launch(&self, py: Python<'_>, kind: BatchKind, batch: &Batch) -> PyResult<Py<PyAny>> {
        let kwargs = self.kwargs.as_ref().map(|k| k.bind(py));
        let obj = self.obj.bind(py);
        let launched = if kind == BatchKind::Images {
            let args = (method_name(kind), f32_bytes(py, &batch.pixels)?);
            obj.call_method("launch", args, kwargs)?
        } else if kind == BatchKind::MaxSim {
            let (ids, types, positions, cu_seqlens) = batch_arrays(py, batch)?;
            let (queries, spans) = query_arrays(py, batch)?;
            let args = (
                method_name(kind),
                ids,
                types,
                positions,
                cu_seqlens,
                queries,
                spans,
            );
            obj.call_method("launch", args, kwargs)?
        } else {
            let (ids, types, positions, cu_seqlens) = batch_arrays(py, batch)?;
            let args = (method_name(kind), ids, types, positions, cu_seqlens);
            obj.call_method("launch", args, kwargs)?
        };
        Ok(launched.unbind())
    }
}

fn method_name(kind: BatchKind) -> &'static str {
    match kind {
        BatchKind::Pooled => "embed",
        BatchKind::AllTokens => "embed_all",
        BatchKind::Predict => "predict",
        BatchKind::Sparse => "embed_sparse",
        BatchKind::Images => "embed_images",
        BatchKind::MaxSim => "maxsim",
    }
}

/// A MaxSim batch's queries (float32) and per-sequence spans (uint32), as bytes.
fn query_arrays<'py>(
    py: Python<'py>,
    batch: &Batch,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    Ok((
        f32_bytes(py, &batch.queries)?,
        u32_bytes(py, &batch.query_spans)?,
    ))
}

type BatchArrays<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

fn batch_arrays<'py>(py: Python<'py>, batch: &Batch) -> PyResult<BatchArrays<'py>> {
    Ok((
        u32_bytes(py, &batch.input_ids)?,
        u32_bytes(py, &batch.token_type_ids)?,
        u32_bytes(py, &batch.position_ids)?,
        u32_bytes(py, &batch.cu_seqlens)?,
    ))
}

/// A method's result (any float array-like) as a row-major f32 matrix.
fn to_matrix(out: &Bound<'_, PyAny>, as_f32: &Bound<'_, PyAny>, method: &str) -> PyResult<Matrix> {
    let array = as_f32.call1((out, "float32"))?;
    let shape: Vec<usize> = array.getattr("shape")?.extract()?;
    let [rows, cols] = shape[..] else {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "Backend.{method} must return a 2-D array, got shape {shape:?}"
        )));
    };
    let bytes = array.call_method0("tobytes")?;
    let data = f32s(bytes.cast::<PyBytes>()?.as_bytes());
    Ok(Matrix { rows, cols, data })
}

fn batch_context(kind: BatchKind, batch: &Batch) -> String {
    format!(
        "{kind:?} batch of {} sequences / {} tokens failed",
        batch.num_seqs(),
        batch.num_tokens()
    )
}

impl Backend for PyBackend {
    fn health(&mut self) -> Result<(), BackendError> {
        Python::attach(|py| {
            let kwargs = self.health_kwargs.as_ref().map(|k| k.bind(py));
            self.obj
                .bind(py)
                .call_method("health", (), kwargs)
                .map(|_| ())
                .map_err(|e| backend_error(py, &e, "Backend.health()", BackendError::Unhealthy))
        })
    }

    fn forward(&mut self, kind: BatchKind, batch: &Batch) -> Result<Matrix, BackendError> {
        Python::attach(|py| {
            self.call(py, kind, batch).map_err(|e| {
                backend_error(py, &e, &batch_context(kind, batch), BackendError::Inference)
            })
        })
    }

    fn pipelines(&self) -> bool {
        self.pipelines
    }

    fn warm(&mut self) {
        if !self.warms {
            return;
        }
        Python::attach(|py| {
            let kwargs = self.health_kwargs.as_ref().map(|k| k.bind(py));
            // A failure here is the next query's to report, with its own context.
            if let Err(e) = self.obj.bind(py).call_method("warm_query", (), kwargs) {
                tracing::debug!(error = %summary(py, &e), "Backend.warm_query() failed");
            }
        })
    }

    fn launch(&mut self, kind: BatchKind, batch: &Batch) -> Result<Launched, BackendError> {
        if !self.pipelines {
            return self.forward(kind, batch).map(Launched::done);
        }
        let context = batch_context(kind, batch);
        let (launched, as_f32) = Python::attach(|py| {
            self.call_launch(py, kind, batch)
                .map(|launched| (launched, self.as_f32.clone_ref(py)))
                .map_err(|e| backend_error(py, &e, &context, BackendError::Inference))
        })?;
        Ok(Launched::new(move || {
            Python::attach(|py| {
                let out = launched.bind(py).call_method0("result");
                out.and_then(|out| to_matrix(&out, as_f32.bind(py), method_name(kind)))
                    .map_err(|e| backend_error(py, &e, &context, BackendError::Inference))
            })
        }))
    }
}
