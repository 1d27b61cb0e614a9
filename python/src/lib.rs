//! `caw_box._native`: the caw_box crate for Python. Turns run on one tokio runtime with the
//! GIL released; results and events cross as JSON (the same objects as `-o json` and
//! `-o stream-json`), which `caw_box/__init__.py` turns into its classes. Errors are
//! `NativeError` whose one argument is the JSON error object; the Python layer maps it to
//! its exception family.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use caw_box::embed::Prepared;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;

create_exception!(_native, NativeError, PyException);

/// caw-box's version.
#[pyfunction]
fn version() -> &'static str {
    caw_box::VERSION
}

fn raise(e: caw_box::Error) -> PyErr {
    NativeError::new_err(serde_json::to_string(&e.report()).unwrap_or_default())
}

/// One runtime for the process: a session's backend connection lives on it, and several
/// Python threads (asyncio's executor) drive turns on it at once.
fn rt() -> PyResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the async runtime: {e}")))?;
    Ok(RT.get_or_init(|| built))
}

/// Connects with these settings (each `None` left to its variable and the config files);
/// `driver` is the `caw-box` executable detached turns run under. Turns of this process
/// leave its signals to Python (Ctrl-C is a `KeyboardInterrupt` that stops the turn).
#[pyfunction]
#[pyo3(signature = (backend=None, namespace=None, context=None, docker_host=None, image_repo=None, driver=None))]
fn connect(
    py: Python<'_>,
    backend: Option<String>,
    namespace: Option<String>,
    context: Option<String>,
    docker_host: Option<String>,
    image_repo: Option<String>,
    driver: Option<String>,
) -> PyResult<()> {
    caw_box::session::runner::leave_signals_to_the_caller();
    let rt = rt()?;
    py.detach(|| {
        let mut b = caw_box::Client::builder();
        if let Some(v) = backend {
            b = b.backend(v);
        }
        if let Some(v) = namespace {
            b = b.namespace(v);
        }
        if let Some(v) = context {
            b = b.context(v);
        }
        if let Some(v) = docker_host {
            b = b.docker_host(v);
        }
        if let Some(v) = image_repo {
            b = b.image_repo(v);
        }
        if let Some(v) = driver {
            b = b.driver(v);
        }
        rt.block_on(b.connect()).map(|_| ()).map_err(raise)
    })
}

/// An open session; one turn at a time.
#[pyclass]
struct NativeSession {
    inner: Arc<tokio::sync::Mutex<Prepared>>,
    id: String,
    /// A detached turn ran since the record was read: another process recorded it, so
    /// this one reads the session again before it uses the record (the next turn's
    /// number, the conversation's key).
    stale: Arc<AtomicBool>,
}

fn wrap(p: Prepared) -> NativeSession {
    NativeSession {
        id: p.session.id().to_string(),
        inner: Arc::new(tokio::sync::Mutex::new(p)),
        stale: Arc::new(AtomicBool::new(false)),
    }
}

/// `p`'s session read again from the backend if a detached turn made it stale.
async fn refresh(p: &mut Prepared, stale: &AtomicBool, id: &str) -> caw_box::Result<()> {
    if stale.swap(false, Ordering::SeqCst) {
        let settings = p.session.record().settings.clone();
        match p.client.open(id).await {
            Ok(mut fresh) => {
                // This process's overrides (as a resume's flags) stay.
                *fresh.settings_mut() = settings;
                p.session = fresh;
            }
            Err(e) => {
                stale.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A new session from `caw-box run`'s flags.
#[pyfunction]
fn start(py: Python<'_>, flags: Vec<String>) -> PyResult<NativeSession> {
    let rt = rt()?;
    py.detach(|| {
        rt.block_on(caw_box::embed::start(&flags, &|_| {}))
            .map(wrap)
            .map_err(raise)
    })
}

/// The session `target` names, with `caw-box resume`'s flags.
#[pyfunction]
fn resume(py: Python<'_>, target: String, flags: Vec<String>) -> PyResult<NativeSession> {
    let rt = rt()?;
    py.detach(|| {
        rt.block_on(caw_box::embed::resume(&target, &flags))
            .map(wrap)
            .map_err(raise)
    })
}

fn busy(id: &str) -> PyErr {
    raise(
        caw_box::Error::usage(format!("session {id} is running a turn in this process"))
            .with_hint("wait for it (one turn at a time per session)"),
    )
}

/// `(result JSON, the turn's error object JSON when it did not succeed)`.
type TurnOut = (String, Option<String>);

fn turn_out(r: &caw_box::TurnResult) -> TurnOut {
    let json = serde_json::to_string(r).unwrap_or_default();
    let err = caw_box::session::runner::turn_error(r)
        .map(|e| serde_json::to_string(&e.report()).unwrap_or_default());
    (json, err)
}

#[pymethods]
impl NativeSession {
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    /// The resume handle; `None` before the vendor's conversation exists.
    fn handle(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut p = self.inner.try_lock().map_err(|_| busy(&self.id))?;
        let rt = rt()?;
        py.detach(|| rt.block_on(refresh(&mut p, &self.stale, &self.id)))
            .map_err(raise)?;
        Ok((!p.session.record().resume_key.is_empty()).then(|| p.session.handle().to_json()))
    }

    /// The session's record (settings, turns) as JSON.
    fn record(&self, py: Python<'_>) -> PyResult<String> {
        let mut p = self.inner.try_lock().map_err(|_| busy(&self.id))?;
        let rt = rt()?;
        py.detach(|| rt.block_on(refresh(&mut p, &self.stale, &self.id)))
            .map_err(raise)?;
        Ok(serde_json::to_string(p.session.record()).unwrap_or_default())
    }

    /// Runs one turn with the GIL released; `on_event` gets each event's JSON as it
    /// happens. Ctrl-C (checked on the main thread) or an exception of `on_event` stops the
    /// turn (recorded as interrupted: the session stays resumable) and is raised once the
    /// turn ended.
    #[pyo3(signature = (prompt, timeout=None, on_event=None))]
    fn send(
        &self,
        py: Python<'_>,
        prompt: String,
        timeout: Option<f64>,
        on_event: Option<Py<PyAny>>,
    ) -> PyResult<TurnOut> {
        let rt = rt()?;
        let inner = self.inner.clone();
        let id = self.id.clone();
        let stale = self.stale.clone();
        py.detach(move || {
            let mut p = inner.try_lock_owned().map_err(|_| busy(&id))?;
            rt.block_on(refresh(&mut p, &stale, &id)).map_err(raise)?;
            let mut options = p.options.clone();
            options.prompt = prompt;
            if let Some(t) = timeout {
                options.timeout = Some(Duration::from_secs_f64(t.max(0.001)));
            }
            let client = p.client.clone();
            // A Mutex, not a RefCell: the event sink is `Send` (a turn's future may move threads).
            let failed: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
            let result = rt.block_on(async {
                let events = |e: &caw_box::Event| {
                    let Some(cb) = &on_event else { return };
                    if failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                        return;
                    }
                    let json = serde_json::to_string(e).unwrap_or_default();
                    if let Err(err) = Python::attach(|py| cb.call1(py, (json,)).map(|_| ())) {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
                    }
                };
                let turn = p.session.send(options, events);
                tokio::pin!(turn);
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                let mut stopper: Option<tokio::task::JoinHandle<()>> = None;
                let result = loop {
                    tokio::select! {
                        r = &mut turn => break r,
                        _ = tick.tick() => {
                            if stopper.is_some() {
                                continue;
                            }
                            if failed.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                                if let Err(e) = Python::attach(|py| py.check_signals()) {
                                    *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                                }
                            }
                            if failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                                stopper = Some(tokio::spawn(stop_until_stopped(client.clone(), id.clone())));
                            }
                        }
                    }
                };
                if let Some(s) = stopper {
                    s.abort();
                }
                result
            });
            if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e);
            }
            result.map(|r| turn_out(&r)).map_err(raise)
        })
    }

    /// `n` forks of this session at the end of turn `at` (its latest by default): new
    /// sessions, each opened with `caw-box resume`'s `flags`; with `prompt`, each fork's
    /// first turn started in a background driver process.
    #[pyo3(signature = (flags, at=None, n=1, name=None, group=None, prompt=None, provider=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn fork(
        &self,
        py: Python<'_>,
        flags: Vec<String>,
        at: Option<u32>,
        n: u32,
        name: Option<String>,
        group: Option<String>,
        prompt: Option<String>,
        provider: Option<String>,
    ) -> PyResult<Vec<NativeSession>> {
        let rt = rt()?;
        let provider = provider
            .as_deref()
            .map(str::parse::<caw_box::ProviderKind>)
            .transpose()
            .map_err(|e| raise(e.into()))?;
        let request = caw_box::ForkRequest {
            at,
            count: n,
            name,
            group,
            provider,
        };
        let forks = py.detach(|| {
            rt.block_on(caw_box::embed::fork(
                &self.id,
                &request,
                &flags,
                prompt.as_deref(),
            ))
            .map_err(raise)
        })?;
        Ok(forks
            .into_iter()
            .map(|p| {
                let s = wrap(p);
                // A detached first turn records in another process.
                s.stale.store(prompt.is_some(), Ordering::SeqCst);
                s
            })
            .collect())
    }

    /// Starts a turn in a background `caw-box` driver process and returns once it runs.
    #[pyo3(signature = (prompt, timeout=None))]
    fn detach(&self, py: Python<'_>, prompt: String, timeout: Option<f64>) -> PyResult<()> {
        let rt = rt()?;
        let inner = self.inner.clone();
        let id = self.id.clone();
        let stale = self.stale.clone();
        py.detach(move || {
            let mut p = inner.try_lock().map_err(|_| busy(&id))?;
            rt.block_on(refresh(&mut p, &stale, &id)).map_err(raise)?;
            let mut options = p.options.clone();
            options.prompt = prompt;
            if let Some(t) = timeout {
                options.timeout = Some(Duration::from_secs_f64(t.max(0.001)));
            }
            let started = rt.block_on(caw_box::embed::detach(&p.client, &p.session, &options));
            // Whether or not it started, the driver may have recorded a turn.
            stale.store(true, Ordering::SeqCst);
            started.map_err(raise)
        })
    }
}

/// Asks for the session's running turn to stop until one is seen running and stopped (the
/// turn may not have started its container yet).
async fn stop_until_stopped(client: caw_box::Client, id: String) {
    loop {
        // Not a warm session's idle container, removed before the turn claimed it.
        if let Ok((_, caw_box::Stopped::Turn)) = client.stop(&id).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits for the running turn of the session `target` names (any process's) and gives its
/// latest turn's result.
#[pyfunction]
fn wait(py: Python<'_>, target: String) -> PyResult<TurnOut> {
    let rt = rt()?;
    py.detach(|| {
        rt.block_on(async { caw_box::Client::connect().await?.wait(&target).await })
            .map(|r| turn_out(&r))
            .map_err(raise)
    })
}

/// Stops the running turn of the session `target` names (any process's).
#[pyfunction]
fn stop(py: Python<'_>, target: String) -> PyResult<String> {
    let rt = rt()?;
    py.detach(|| {
        rt.block_on(async { caw_box::Client::connect().await?.stop(&target).await })
            .map(|(id, _)| id.to_string())
            .map_err(raise)
    })
}

/// `ls --json`'s rows, as JSON.
#[pyfunction]
#[pyo3(signature = (group=None))]
fn sessions(py: Python<'_>, group: Option<String>) -> PyResult<String> {
    let rt = rt()?;
    py.detach(|| {
        rt.block_on(caw_box::embed::sessions(group))
            .map(|v| v.to_string())
            .map_err(raise)
    })
}

/// `auth status --json`, as JSON.
#[pyfunction]
fn auth_status() -> PyResult<String> {
    caw_box::embed::auth_status()
        .map(|v| v.to_string())
        .map_err(raise)
}

/// `auth collect`, as JSON.
#[pyfunction]
#[pyo3(signature = (providers, keyring=false))]
fn auth_collect(py: Python<'_>, providers: Vec<String>, keyring: bool) -> PyResult<String> {
    py.detach(|| {
        caw_box::embed::auth_collect(&providers, keyring)
            .map(|v| v.to_string())
            .map_err(raise)
    })
}

/// `auth login` with these flags, as JSON (the items stored): `api_key` stored as the
/// provider's key, else the vendor's flow run with the GIL released, `on_prompt` called
/// with the prompt's JSON (`{"provider","url","code"}`; in a paste-code flow
/// `{"provider","url","needs":"code"}`, and what it returns, a str, is the pasted code). Ctrl-C (checked on the main
/// thread) or an exception of `on_prompt` ends the flow (nothing stored, nothing left) and
/// is raised once it ended.
#[pyfunction]
#[pyo3(signature = (flags, api_key=None, on_prompt=None))]
fn auth_login(
    py: Python<'_>,
    flags: Vec<String>,
    api_key: Option<String>,
    on_prompt: Option<Py<PyAny>>,
) -> PyResult<String> {
    caw_box::session::runner::leave_signals_to_the_caller();
    let rt = rt()?;
    py.detach(move || {
        let failed: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
        let cancel = Arc::new(tokio::sync::Notify::new());
        let result = rt.block_on(async {
            let mut prompt = |json: serde_json::Value| -> Option<String> {
                let cb = on_prompt.as_ref()?;
                let text = json.to_string();
                // A paste-code flow's prompt gets the code back (a str); any other value
                // is no code.
                let returned = Python::attach(|py| {
                    cb.call1(py, (text,))
                        .map(|r| r.extract::<Option<String>>(py).ok().flatten())
                });
                match returned {
                    Ok(code) => code,
                    Err(err) => {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
                        cancel.notify_one();
                        None
                    }
                }
            };
            let login = caw_box::embed::auth_login(&flags, api_key, Some(cancel.clone()), &mut prompt);
            tokio::pin!(login);
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    r = &mut login => break r,
                    _ = tick.tick() => {
                        if let Err(e) = Python::attach(|py| py.check_signals()) {
                            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                            cancel.notify_one();
                        }
                    }
                }
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        result.map(|v| v.to_string()).map_err(raise)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add_class::<NativeSession>()?;
    for f in [
        wrap_pyfunction!(version, m)?,
        wrap_pyfunction!(connect, m)?,
        wrap_pyfunction!(start, m)?,
        wrap_pyfunction!(resume, m)?,
        wrap_pyfunction!(wait, m)?,
        wrap_pyfunction!(stop, m)?,
        wrap_pyfunction!(sessions, m)?,
        wrap_pyfunction!(auth_status, m)?,
        wrap_pyfunction!(auth_collect, m)?,
        wrap_pyfunction!(auth_login, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
