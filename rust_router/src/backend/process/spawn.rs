//! Starting one worker process per device (the router's side) and being one (the worker's).
//!
//! The router runs `trt_tei_runtime.device_worker` per device with the same interpreter and
//! import path as its own. Each worker loads the backend class for its one
//! device exactly as the router would in one process ([`python::load`]), says it is ready on
//! its bulk socket, and serves its lanes ([`serve_lane`]) until the router closes them. A
//! worker is in a process group of its own (a Ctrl-C reaches the router, which drains, not
//! the workers under it) and dies with the router's thread that started it.

use super::client::{Worker, WorkerLane};
use super::region::{Layout, Region};
use super::serve::serve_lane;
use super::wire::Ready;
use super::DeviceWorkers;
use crate::backend::python::{self, PythonBackendOptions};
use crate::backend::{
    BackendError, BackendFactory, DeviceBackends, ImagePreprocessor, LoadedBackend, ModelInfo,
};
use crate::images::pixels::RustImages;
use pyo3::prelude::*;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of a lane's output slot: any pooled or score batch, and per-token rows of up to
/// 16 Ki tokens × 1,024 floats; larger results travel on the socket. Pages never written take
/// no memory.
const OUTPUT_SLOT_BYTES: usize = 64 << 20;

/// The worker's `python -c` program: the router's own import path, exactly (`-m` would put
/// the working directory first, where a source checkout without the compiled router may
/// be), then the worker's main.
const WORKER_BOOTSTRAP: &str = "import json, sys; sys.path[:] = json.loads(sys.argv[1]); \
     from trt_tei_runtime.device_worker import main; main(sys.argv[2])";

/// How long a worker whose lanes were closed may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// The backend the flags ask for: in this process, or one worker process per device.
pub fn factory(opts: PythonBackendOptions) -> BackendFactory {
    Box::new(move || load(&opts))
}

/// What a worker is told on its command line.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerSpec {
    options: PythonBackendOptions,
    bulk_fd: RawFd,
    bulk_region_fd: RawFd,
    interactive: Option<(RawFd, RawFd)>,
    input_slot: usize,
    output_slot: usize,
    json_logs: bool,
}

/// How the router's interpreter starts a worker, and the devices the flags name.
struct Plan {
    executable: String,
    /// `sys.path`, as JSON.
    python_path: String,
    devices: Vec<String>,
}

fn load(opts: &PythonBackendOptions) -> Result<LoadedBackend, BackendError> {
    match plan(opts)? {
        Some(plan) => start_workers(opts, plan),
        None => python::load(opts),
    }
}

/// `Some` when the devices are to be served by worker processes.
fn plan(opts: &PythonBackendOptions) -> Result<Option<Plan>, BackendError> {
    if opts.device_workers == DeviceWorkers::Threads {
        return Ok(None);
    }
    Python::attach(|py| {
        let start = |e: PyErr| BackendError::Start(format!("planning the device workers: {e}"));
        let cls = python::backend_class(py, &opts.class_path)?;
        let names_devices = cls
            .getattr("device_names")
            .is_ok_and(|method| !method.is_none());
        if !names_devices {
            if opts.device_workers == DeviceWorkers::Processes {
                return Err(BackendError::Start(format!(
                    "`--device-workers processes` needs `{}.device_names(devices)`, which names \
                     the devices a `devices` spec means",
                    opts.class_path
                )));
            }
            return Ok(None);
        }
        let spec = opts.devices.clone().or_else(|| opts.device.clone());
        let devices: Vec<String> = cls
            .call_method1("device_names", (spec,))
            .and_then(|names| names.extract())
            .map_err(|e| BackendError::Start(python::summary(py, &e)))?;
        if !opts.device_workers.uses_processes(&devices) {
            return Ok(None);
        }
        let sys = py.import("sys").map_err(start)?;
        let executable: String = sys
            .getattr("executable")
            .and_then(|e| e.extract())
            .map_err(start)?;
        let path: Vec<String> = sys
            .getattr("path")
            .and_then(|p| p.extract())
            .map_err(start)?;
        let python_path = serde_json::to_string(&path)
            .map_err(|e| BackendError::Start(format!("sys.path: {e}")))?;
        Ok(Some(Plan {
            executable,
            python_path,
            devices,
        }))
    })
}

/// A worker process, reaped when the last lane over it is dropped.
struct WorkerProcess {
    device: String,
    child: Mutex<Child>,
}

impl WorkerProcess {
    fn wait_for_exit(&self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => return None,
            }
        }
    }

    fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Worker for WorkerProcess {
    fn device(&self) -> &str {
        &self.device
    }

    fn why_stopped(&self) -> String {
        match self.wait_for_exit(Duration::from_millis(500)) {
            Some(status) => describe_exit(status),
            None => "it closed its lane but is still running".into(),
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.wait_for_exit(EXIT_GRACE).is_none() {
            tracing::warn!(device = %self.device, "a device worker did not exit: killing it");
            self.kill();
        }
    }
}

fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("it exited with status {code}"),
        (None, Some(signal)) => format!("it was killed by signal {signal}"),
        _ => format!("it ended ({status})"),
    }
}

/// The router's end of a lane: its socket and its mapped region.
type RouterEnd = (UnixStream, Region);
/// The worker's end of a lane, as descriptors it inherits: its socket and the region's file.
type WorkerEnd = (OwnedFd, OwnedFd);

/// One started worker: its process and the router's ends of its lanes.
struct Started {
    process: Arc<WorkerProcess>,
    bulk: RouterEnd,
    interactive: Option<RouterEnd>,
}

fn start_workers(opts: &PythonBackendOptions, plan: Plan) -> Result<LoadedBackend, BackendError> {
    let layout = Layout::for_batches(opts.max_batch_tokens, OUTPUT_SLOT_BYTES);
    let mut started = Vec::with_capacity(plan.devices.len());
    for (index, device) in plan.devices.iter().enumerate() {
        match spawn_worker(opts, &plan, index, device, layout) {
            Ok(worker) => started.push(worker),
            Err(err) => {
                started.iter().for_each(|w: &Started| w.process.kill());
                return Err(err);
            }
        }
    }
    tracing::info!(devices = ?plan.devices, "started one worker process per device");
    let mut infos = Vec::with_capacity(started.len());
    let mut devices = Vec::with_capacity(started.len());
    let mut failure = None;
    for worker in started {
        match ready(worker) {
            Ok((info, backends)) => {
                infos.push(info);
                devices.push(backends);
            }
            Err(err) => {
                failure.get_or_insert(err);
            }
        }
    }
    if let Some(err) = failure {
        // Dropping the lanes closes them; the workers still loading are killed after the grace.
        return Err(err);
    }
    let mut info = infos.swap_remove(0);
    info.devices = Some(plan.devices.clone());
    info.device = plan.devices.first().cloned();
    // Worker processes hold the runtime: this process preprocesses images only where the
    // router matches the model's steps, and sends their pixels.
    let images = info.image_input.as_ref().and_then(|input| {
        let steps = input.steps.as_ref()?;
        match RustImages::new(steps, None) {
            Ok(images) => Some(Arc::new(images) as Arc<dyn ImagePreprocessor>),
            Err(why) => {
                tracing::warn!("images are refused: the runtime preprocesses them ({why}), and it runs in device worker processes");
                None
            }
        }
    });
    Ok(LoadedBackend {
        info,
        devices,
        images,
    })
}

/// Waits for a worker's ready message and builds its lanes.
fn ready(worker: Started) -> Result<(ModelInfo, DeviceBackends), BackendError> {
    let Started {
        process,
        bulk: (mut bulk_socket, bulk_region),
        interactive,
    } = worker;
    let device = process.device.clone();
    let fail = |why: String| {
        BackendError::Start(format!(
            "the worker process of {device} could not start: {why}"
        ))
    };
    let ready = match Ready::read(&mut bulk_socket) {
        Ok(Ok(ready)) => ready,
        Ok(Err(BackendError::Start(m))) => return Err(BackendError::Start(m)),
        Ok(Err(err)) => return Err(fail(err.to_string())),
        Err(_) => {
            return Err(fail(format!(
                "{} (its log is above)",
                process.why_stopped()
            )))
        }
    };
    let info: ModelInfo = serde_json::from_value(ready.info)
        .map_err(|e| fail(format!("its Backend.info() is invalid: {e}")))?;
    let worker: Arc<dyn Worker> = process;
    let interactive = match (ready.interactive, interactive) {
        (true, Some((socket, region))) => {
            Some(
                Box::new(WorkerLane::new(socket, region, worker.clone(), false))
                    as Box<dyn crate::backend::Backend + Send>,
            )
        }
        _ => None,
    };
    let bulk = Box::new(WorkerLane::new(
        bulk_socket,
        bulk_region,
        worker,
        ready.pipelines,
    ));
    Ok((info, DeviceBackends { bulk, interactive }))
}

fn spawn_worker(
    opts: &PythonBackendOptions,
    plan: &Plan,
    index: usize,
    device: &str,
    layout: Layout,
) -> Result<Started, BackendError> {
    let io = |what: &str, e: std::io::Error| {
        BackendError::Start(format!("starting the worker of {device}: {what}: {e}"))
    };
    let lane = |name: &str| -> Result<(RouterEnd, WorkerEnd), BackendError> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| io("socket pair", e))?;
        let (region, region_fd) = Region::create(&format!("trt-tei-{index}-{name}"), layout)
            .map_err(|e| io("shared memory", e))?;
        Ok(((ours, region), (OwnedFd::from(theirs), region_fd)))
    };
    let (bulk, bulk_fds) = lane("bulk")?;
    let (interactive, interactive_fds) = match opts.interactive_lane {
        true => {
            let (ours, theirs) = lane("interactive")?;
            (Some(ours), Some(theirs))
        }
        false => (None, None),
    };
    let mut options = opts.clone();
    options.device = Some(device.to_string());
    options.devices = None;
    let spec = WorkerSpec {
        options,
        bulk_fd: bulk_fds.0.as_raw_fd(),
        bulk_region_fd: bulk_fds.1.as_raw_fd(),
        interactive: interactive_fds
            .as_ref()
            .map(|(s, r)| (s.as_raw_fd(), r.as_raw_fd())),
        input_slot: layout.input_slot,
        output_slot: layout.output_slot,
        json_logs: opts.json_logs,
    };
    let spec = serde_json::to_string(&spec).map_err(|e| io("spec", std::io::Error::other(e)))?;
    let mut inherited = vec![bulk_fds.0.as_raw_fd(), bulk_fds.1.as_raw_fd()];
    if let Some((s, r)) = &interactive_fds {
        inherited.extend([s.as_raw_fd(), r.as_raw_fd()]);
    }
    let mut command = Command::new(&plan.executable);
    command.args(["-c", WORKER_BOOTSTRAP, &plan.python_path, &spec]);
    // SAFETY: between fork and exec the closure only makes async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            for &fd in &inherited {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|e| io(&plan.executable, e))?;
    // The worker's ends are its own now: closing ours lets the router see it exit.
    drop((bulk_fds, interactive_fds));
    Ok(Started {
        process: Arc::new(WorkerProcess {
            device: device.to_string(),
            child: Mutex::new(child),
        }),
        bulk,
        interactive,
    })
}

/// The worker process's life: load, say so, serve until the router closes the lanes. Returns
/// the exit code.
pub fn run_worker(spec: &str) -> i32 {
    let spec: WorkerSpec = match serde_json::from_str(spec) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("device worker: invalid spec: {e}");
            return 2;
        }
    };
    crate::logging::init(spec.json_logs, false);
    let layout = Layout {
        input_slot: spec.input_slot,
        output_slot: spec.output_slot,
    };
    // SAFETY: the router handed these descriptors to this process alone (module docs).
    let own = |fd: RawFd| unsafe { OwnedFd::from_raw_fd(fd) };
    let mut bulk = UnixStream::from(own(spec.bulk_fd));
    let lane = |socket: RawFd, region: RawFd| -> std::io::Result<(UnixStream, Region)> {
        Ok((
            UnixStream::from(own(socket)),
            Region::open(own(region), layout)?,
        ))
    };
    let bulk_region = match Region::open(own(spec.bulk_region_fd), layout) {
        Ok(region) => region,
        Err(e) => {
            let _ = Ready::write(
                &Err(BackendError::Start(format!("shared memory: {e}"))),
                &mut bulk,
            );
            return 1;
        }
    };
    let interactive = spec.interactive.map(|(s, r)| lane(s, r));
    let device = spec.options.device.clone().unwrap_or_default();
    let loaded = python::load(&spec.options);
    let (info, backends) = match loaded {
        Ok(mut loaded) => {
            let json = serde_json::to_value(&loaded.info).unwrap_or_default();
            (json, loaded.devices.swap_remove(0))
        }
        Err(err) => {
            let _ = Ready::write(&Err(err), &mut bulk);
            return 1;
        }
    };
    let DeviceBackends {
        bulk: bulk_backend,
        interactive: interactive_backend,
    } = backends;
    let mut threads = Vec::new();
    let serves_interactive = interactive_backend.is_some();
    if let (Some(backend), Some(Ok((socket, region)))) = (interactive_backend, interactive) {
        let thread = std::thread::Builder::new()
            .name("worker-interactive".into())
            .spawn(move || serve_lane(backend, socket, region, "worker-interactive-reply"));
        match thread {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                let _ = Ready::write(&Err(BackendError::Start(e.to_string())), &mut bulk);
                return 1;
            }
        }
    }
    let ready = Ready {
        info,
        pipelines: bulk_backend.pipelines(),
        interactive: serves_interactive,
    };
    if Ready::write(&Ok(ready), &mut bulk).is_err() {
        return 1; // the router is gone
    }
    tracing::info!(%device, "device worker serving");
    let mut code = 0;
    if let Err(e) = serve_lane(bulk_backend, bulk, bulk_region, "worker-bulk-reply") {
        tracing::error!(%device, "the bulk lane failed: {e}");
        code = 1;
    }
    for thread in threads {
        if !matches!(thread.join(), Ok(Ok(()))) {
            code = 1;
        }
    }
    code
}
