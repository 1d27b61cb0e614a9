//! Backends run what the commands describe. Docker (through bollard) is the only one today;
//! the commands reach it only through [`docker::DockerBackend`], so a second backend
//! (Kubernetes) can slot in beside it.

pub mod docker;

pub use docker::DockerBackend;
