//! `caw_box._native`: the caw_box crate for Python. A turn runs on a tokio runtime with the
//! GIL released; results cross as JSON (the same objects as `-o json`), which
//! `caw_box/__init__.py` turns into its classes.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// caw-box's version.
#[pyfunction]
fn version() -> &'static str {
    caw_box::VERSION
}

/// The error's JSON object (`kind`, `message`, `hint`, `exit_code`), raised as a
/// RuntimeError whose one argument is that JSON; the Python layer maps it to its family.
fn raise(e: caw_box::Error) -> PyErr {
    PyRuntimeError::new_err(serde_json::to_string(&e.report()).unwrap_or_default())
}

fn runtime() -> PyResult<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the async runtime: {e}")))
}

/// Connects with these settings (each `None` left to its variable and the config files).
#[pyfunction]
#[pyo3(signature = (backend=None, namespace=None, context=None, docker_host=None, image_repo=None))]
fn connect(
    py: Python<'_>,
    backend: Option<String>,
    namespace: Option<String>,
    context: Option<String>,
    docker_host: Option<String>,
    image_repo: Option<String>,
) -> PyResult<()> {
    py.allow_threads(|| {
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
        runtime()?.block_on(b.connect()).map(|_| ()).map_err(raise)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    Ok(())
}
