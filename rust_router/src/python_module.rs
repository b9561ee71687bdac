//! The `trt_tei_runtime._router` extension module: `run(argv)` serves the router with the
//! Python backend. It ties the flags (`cli`) and the process (`server`) to the PyO3 backend,
//! so the backend layer itself depends on neither.

use crate::backend::process::spawn;
use crate::backend::python::PythonBackendOptions;
use crate::cli::Args;
use pyo3::prelude::*;

/// What the Python backend's constructor needs, from the flags.
pub fn backend_options(args: &Args) -> PythonBackendOptions {
    let mut env = Vec::new();
    if let Some(token) = &args.hf_token {
        env.push(("HF_TOKEN".to_string(), token.clone()));
    }
    if let Some(cache) = &args.huggingface_hub_cache {
        env.push(("HF_HUB_CACHE".to_string(), cache.clone()));
    }
    PythonBackendOptions {
        class_path: args.python_backend_class.clone(),
        model_id: args.model_id().to_string(),
        revision: args.revision.clone(),
        dtype: args.dtype.clone(),
        pooling: args.pooling.clone(),
        device: args.device.clone(),
        devices: args.devices.clone(),
        task: args.task.clone(),
        max_active_dims: args.max_active_dims,
        max_batch_tokens: args.max_batch_tokens,
        max_batch_requests: args.max_batch_requests,
        max_bulk_step_ms: args.max_bulk_step_ms,
        memory_fraction: Some(args.memory_fraction),
        interactive_lane: args.interactive_max_tokens > 0,
        env,
        device_workers: args.device_workers,
        json_logs: args.json_output,
        lora_adapters: args
            .model_adapters
            .iter()
            .map(|a| (a.name.clone(), a.path.clone()))
            .collect(),
    }
}

/// Runs the server with `argv` (as `sys.argv`) and returns the exit code.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> i32 {
    // Before the model loads: a CPU model's activations would otherwise grow the heap's free
    // memory without bound (see `allocator::bound_fragmentation`).
    crate::allocator::bound_fragmentation();
    // Detach for the whole server life: the backend threads attach for each call, and
    // nothing else in the process needs the interpreter.
    py.detach(move || {
        let make: crate::server::MakeBackend =
            Box::new(|args: &Args| Ok(spawn::factory(backend_options(args))));
        crate::server::main_with_args(argv, make)
    })
}

/// The fields of `Backend.info()` the router reads: the contract, as the router defines it
/// (tests compare the runtime's `info()` with it).
#[pyfunction]
fn model_info_fields() -> Vec<&'static str> {
    crate::backend::ModelInfo::FIELDS.to_vec()
}

/// The life of a device worker process (`trt_tei_runtime.device_worker.main(SPEC)`, started
/// by the router with `--device-workers processes`); returns its exit code.
#[pyfunction]
fn run_device_worker(py: Python<'_>, spec: String) -> i32 {
    crate::allocator::bound_fragmentation();
    py.detach(move || spawn::run_worker(&spec))
}

/// An image's pixels as the router makes them in Rust, under `steps_json` (the JSON of
/// `ImagePreprocessor.steps()`): `(shape, float32 bytes)`. `ValueError` for steps the router
/// leaves to the runtime and for every image it would (tests compare it with the runtime).
#[pyfunction]
fn preprocess_image(
    py: Python<'_>,
    steps_json: &str,
    data: Vec<u8>,
    max_pixels: u64,
) -> PyResult<([usize; 3], Py<pyo3::types::PyBytes>)> {
    use pyo3::exceptions::PyValueError;
    let steps: crate::backend::ImageSteps = serde_json::from_str(steps_json)
        .map_err(|e| PyValueError::new_err(format!("malformed steps: {e}")))?;
    let (pixels, shape) = py
        .detach(|| crate::images::pixels::preprocess(&steps, &data, max_pixels))
        .map_err(PyValueError::new_err)?;
    let bytes = pyo3::types::PyBytes::new_with(py, pixels.len() * 4, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(4).zip(&pixels) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })?;
    Ok((shape, bytes.unbind()))
}

#[pymodule]
fn _router(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(model_info_fields, m)?)?;
    m.add_function(wrap_pyfunction!(run_device_worker, m)?)?;
    m.add_function(wrap_pyfunction!(preprocess_image, m)?)?;
    m.add_class::<crate::python_tokenizer::FlatTokenizer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
